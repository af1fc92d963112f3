"""What the gateway learns from a backend's repository index, and when it reads it again.

Every backend, whatever its signal source, is asked for its repository index on the health
period (``/v2/repository/index``, body ``{}``: every model with its state, Triton's shape
``[{"name", "version", "state", "reason"}]``; ``Poller.probe_index``) and the states go to
``BackendRegistry.set_index``: READY models are routable there, others are known but not
(503, not 404; entries that say "not loaded" count as absent: 404). The index is advisory,
never health: a backend that does not answer it (refused, timeout, a bad body) keeps its last
known set and is not ejected for it; one without the extension (404/405) keeps its configured
``models``.
"""

from __future__ import annotations

from evenserve.core import wire
from evenserve.gateway.backends import STATES, BackendState, best_state


class BadIndex(ValueError):
    """A repository index answer that is not a list of ``{name, state}`` objects."""


#: Reasons an UNAVAILABLE entry gives when the model is simply not loaded there (Triton's
#: ``unloaded``; an evenserve worker's ``not loaded`` and ``unloaded``): the backend does not
#: host it, so the gateway answers 404 for it as the backend itself does, not 503.
NOT_LOADED_REASONS = frozenset({"unloaded", "not loaded"})


def parse_index(body: bytes) -> dict[str, str]:
    """A repository index answer as model -> state (the best over its versions; a state
    Triton does not name counts as UNAVAILABLE; entries with an unroutable name are
    skipped, and so are models that are not loaded: no state at all, as Triton lists a
    folder never loaded, or UNAVAILABLE for a reason in ``NOT_LOADED_REASONS``). BadIndex
    for an answer that is not such a list."""
    try:
        doc = wire.parse_json(body, "index")
    except ValueError as exc:
        raise BadIndex(str(exc)) from None
    if not isinstance(doc, list):
        raise BadIndex(f"expected a list, got {type(doc).__name__}")
    found: dict[str, list[str]] = {}
    for i, entry in enumerate(doc):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise BadIndex(f"entry {i}: expected an object with a name")
        name = entry["name"]
        if not wire.is_safe_name(name):
            continue
        state = entry.get("state")
        state = state.upper() if isinstance(state, str) else ""
        reason = entry.get("reason")
        if not state or (
            state == "UNAVAILABLE"
            and isinstance(reason, str)
            and reason.strip().lower() in NOT_LOADED_REASONS
        ):
            continue
        found.setdefault(name, []).append(state if state in STATES else "UNAVAILABLE")
    return {m: best_state(states) for m, states in found.items()}


#: How long a backend's index is trusted while its models version has not moved (a safety
#: net: any change the version did not show is seen within this).
INDEX_REFRESH_S = 10.0


def index_due(st: BackendState, now_s: float) -> bool:
    """Whether ``st``'s index is to be read (``Poller.probe_index``): always for a backend
    whose load reports carry no models version; else when the version moved since the last
    read, or ``INDEX_REFRESH_S`` after it."""
    version = st.models_version
    return not (
        version is not None
        and version == st.index_version
        and now_s - st.index_read_s < INDEX_REFRESH_S
    )
