"""How long each identity held each GPU lately: the measure GPU lease turns go by (SERVER §5).

Turns by grants gave a user of 10 ms kernels one grant per 2 s beside a neighbour holding
the GPU 2 s a grant; turns by hold time give each the same GPU time. "Lately" is an
exponential decay, not a window of past grants: each (identity, GPU) keeps one number and
the time it was last brought up to date, so memory is one small record per identity and
GPU whatever the number of grants, and every identity's time fades at the same rate, which
keeps their order as it was until one of them holds a GPU again. A window would need every
grant inside it kept (or buckets), and would make a long-past hold vanish all at once.

The half-life is 60 s: long beside a grant (milliseconds to seconds), so the time each
identity is credited is close to what it really held, and short beside a working session,
so a hold of an hour ago no longer counts. An identity that held for minutes waits while
the others catch up, but not for ever: its time halves each minute while theirs, however
busy, stays under 87 s (1/ln 2 half-lives of holding without a break), so it comes first
within a few minutes at most.
"""

from __future__ import annotations

from collections.abc import Iterable

#: seconds after which a hold counts half
HALF_LIFE_SECONDS = 60.0
#: below this a record is dropped: it could only break a tie between identities that hardly
#: held the GPU at all, and dropping it keeps the table to who held a GPU in the last half
#: hour or so (20 half-lives for a 1-second hold, 32 for an hour's)
NEGLIGIBLE_SECONDS = 1e-6


class RecentHoldTime:
    """Decayed seconds each identity held each GPU (module docstring)."""

    def __init__(self, half_life: float = HALF_LIFE_SECONDS) -> None:
        self._half_life = half_life
        #: (identity, GPU) -> (seconds held, as of this monotonic time)
        self._held: dict[tuple[str | None, int], tuple[float, float]] = {}

    def _now_worth(self, record: tuple[float, float], now: float) -> float:
        seconds, as_of = record
        return seconds * 0.5 ** (max(0.0, now - as_of) / self._half_life)

    def charge(self, identity: str | None, gpu: int, seconds: float, now: float) -> None:
        """``identity`` held ``gpu`` for ``seconds`` until ``now``."""
        key = (identity, gpu)
        record = self._held.get(key)
        earlier = 0.0 if record is None else self._now_worth(record, now)
        self._held[key] = (earlier + max(0.0, seconds), now)
        faded = [k for k, r in self._held.items() if self._now_worth(r, now) < NEGLIGIBLE_SECONDS]
        for k in faded:
            del self._held[k]

    def of(self, identity: str | None, gpus: Iterable[int], now: float) -> float:
        """The most ``identity`` held lately any of ``gpus`` (the GPUs a waiter may take: it
        goes first on all of them only once it is owed time on each)."""
        return max(
            (
                self._now_worth(record, now)
                for gpu in gpus
                if (record := self._held.get((identity, gpu))) is not None
            ),
            default=0.0,
        )

    def __len__(self) -> int:
        return len(self._held)
