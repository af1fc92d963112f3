"""A device's memory: the profiles' account (resident weights, the weights of the models being
loaded, and the working memory of the batches running), or the figures a driver measured on a
real device, which replace it."""

from __future__ import annotations


class MemoryAccount:
    __slots__ = ("batches_bytes", "loading_bytes", "measured", "total_bytes", "weights_bytes")

    def __init__(self, weights_bytes: float, total_bytes: float | None) -> None:
        self.weights_bytes = weights_bytes
        self.total_bytes = total_bytes
        #: Working memory of the batches running now (profiles).
        self.batches_bytes = 0.0
        #: Weights of the models being loaded (held from the start of their load; they join
        #: ``weights_bytes`` once the model is hosted).
        self.loading_bytes = 0.0
        #: (used, total) a driver measured; None: use the account.
        self.measured: tuple[float | None, float | None] | None = None

    def used_total(self) -> tuple[float | None, float | None]:
        if self.measured is not None:
            return self.measured
        return self.weights_bytes + self.loading_bytes + self.batches_bytes, self.total_bytes

    def free_bytes(self) -> float | None:
        """Free memory (None when unknown), never below 0."""
        if self.measured is None:
            total = self.total_bytes
            if total is None:
                return None
            used: float | None = self.weights_bytes + self.loading_bytes + self.batches_bytes
        else:
            used, total = self.measured
        if used is None or total is None:
            return None
        return total - used if total > used else 0.0

    def unreserved_bytes(self) -> float | None:
        """What a model load may still take (None when unknown: no total, or a measured
        device): the total less the resident weights and those being loaded (the batches'
        working memory comes and goes, so it does not count)."""
        if self.measured is not None or self.total_bytes is None:
            return None
        return self.total_bytes - self.weights_bytes - self.loading_bytes
