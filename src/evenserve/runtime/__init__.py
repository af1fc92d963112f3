"""Model runtimes behind one small protocol: emulated (profile-driven), transformers, torch,
onnx. torch, transformers and onnxruntime are optional extras, imported only when loading."""
