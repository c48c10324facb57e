"""Where iterations end, for the policies' per-iteration state (``Policy.on_iteration``).

A training loop with a ``torch.optim`` optimizer ends each iteration in the optimizer's step post-hook. Without
one (a hand-written update, an optimizer outside ``torch.optim``) no hook fires, and without iteration ends the
``uvmprefetch`` policy's per-iteration occurrence counts never reset: its counted n-gram and stable-signature
tables stop finding anything and it falls back to name n-grams (the standard traces at 2x, whole run: 1.10-1.17x
the oracle with the recorded ends, 1.11-1.34x with none, 1.09-1.17x with these; ``bench/iteration_marks.py``).

``IterationEnds`` infers them from the launch phases until the first hooked step is seen: the first launch after
a backward pass starts the next iteration. Each iteration is then the update, the forward and the backward
pass: the same launches every time, which is what the policy needs (the cut's phase matters less than its
regularity). A loop with a hooked step may still run forward-phase launches between the backward pass and the
step (gradient clipping): the first of them ends the first iteration, so that step's hook, with no backward
launch since, ends none (the user's loop and the iteration count stay in step); from then on only the hooks
end iterations.
"""

from __future__ import annotations


class IterationEnds:
    """Online: ``ends_before(phase)`` before each launch, ``step()`` at each hooked optimizer step; each returns
    whether the iteration ends there."""

    def __init__(self) -> None:
        self.steps_seen = 0
        self.inferred = 0  # iteration ends inferred (not from a hooked step)
        self._prev = ""
        self._backward_since = True  # a backward launch ran since the last inferred end (or there was none)

    def step(self) -> bool:
        """A ``torch.optim`` step ran: True when its hook ends the iteration (False: an inferred end already did,
        with no backward pass since)."""
        self.steps_seen += 1
        return self._backward_since or self.steps_seen > 1

    def ends_before(self, phase: str) -> bool:
        """The launch about to run has phase ``phase`` ("forward", "backward", "optimizer", ...): True when the
        iteration ends before it (inferred)."""
        prev, self._prev = self._prev, phase
        if phase == "backward":
            self._backward_since = True
        if self.steps_seen or prev != "backward" or phase != "forward":
            return False
        self.inferred += 1
        self._backward_since = False
        return True
