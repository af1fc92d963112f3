"""``evenserve optimize``: a model's cheaper variants, gated, profiled, and the cheapest chosen.

For one torch-based model (runtime ``transformers`` or ``torch``) on one device, each variant
the device supports is built and loaded, and then:

1. **Precision check**: the precision asked for is the one that runs. For torch variants the
   dtypes of the weights (qint8 for dynamically quantized layers) and of every leaf module's
   floating outputs during one batch; for ONNX Runtime variants the graph's initializers and
   quantized operators. The latency ratio against fp32 (at batch 8 on the CPU, the largest
   profiled batch on a GPU) is reported: on a GPU a reduced-precision variant no faster
   than fp32 (within 5 %) fails the check (an "fp16" engine that runs fp32), on the CPU it
   is a note (bf16/fp16 without native support is legitimately slower).
2. **Profile** at the batch sizes, as ``evenserve profile`` measures them (same timed call),
   written to ``variants/NAME/profile.yaml``; throughput is the best ``items/s`` over the
   batch sizes whose latency leaves room for the SLO (``2 x latency <= slo_ms``: a request
   may wait for the running batch, then run in the next).
3. **Correctness gate** on the gate set (``optimize.calibration`` or synthetic inputs from
   the input spec): top-1 agreement and cosine against fp32's outputs, thresholds from
   model.yaml's ``optimize:``. A variant slower than fp32 cannot be chosen, so its gate runs
   on the first 64 items only (``gate.items`` says how many).

A variant that fails any of them is rejected with its figures. ``optimize`` chooses the
highest-throughput variant that passes and meets the SLO and writes ``variant.yaml`` (the
runtime section, the profile, the provenance) into the model folder, where the worker and
``evenserve profile`` pick it up (``repository``); the full report goes to
``variants/optimize.json``.

Modules: ``variants`` (the kinds, what a device runs), ``build`` (a variant's runtime and
section), ``checks`` (gate set, precision check, throughput), ``selection`` (figures, report,
choice, variant.yaml), ``run`` (``optimize``, the loop over the variants).
"""
