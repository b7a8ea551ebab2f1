"""The two kinds of meter a provider's per-minute budget runs on, each mirrored as the answers
tell it (`consumers.ai.rate_budget` spends them before each try):

- A continuously refilled bucket (OpenAI's, Anthropic's): `x-ratelimit-{limit,remaining,reset}-*`,
  the refill read off as (limit - remaining) / reset, which holds at any time scale. A declared
  budget (per real-scale minute, so a time scale shortens the minute) is taken for one too.
- A fixed period (a gateway's clock minute, LiteLLM's proxy): a limit and what remains, no reset.
  The meter counts each try as it arrives, refused ones too, and starts again when its minute
  turns, while what it announces counts answers. What remains, less this period's tries not
  answered yet, is spent evenly over what is left of the period; then the budget holds until the
  period turns. When it turns is learned from the answers: what remains going back up between
  two answers marks a turn, and a minute's limit repeats every 60 s of the real clock whatever
  the time scale.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

RISE = 1 / 32  # of a period's size: more remaining than our answers leave by this is a turn
MARGIN = 0.01  # of a period: the least of its end kept free of tries (their way to the meter)
RECHECK_S = 0.5  # the longest a waiting try sleeps: a quota's share may grow meanwhile


@dataclass
class RefilledBudget:
    """A continuously refilled budget: `size` per `period_s`; `level` what is left now."""

    size: float
    period_s: float
    level: float
    at: float  # when `level` was counted: it refills from then on
    held_until: float = -math.inf
    refusals: int = 0  # budget refusals since the last answer
    generation: int = 0  # a refilled budget has no periods: every try is of the one
    turns_seen: int = 0
    share: float | None = None  # what a quota shared with other fleets grants of `size` (None: all)

    @property
    def room(self) -> float:
        """What this budget may hold and refills per period: its size, or its share of it."""
        return self.size if self.share is None else min(self.size, self.share)

    def refill(self, now: float) -> None:
        if now > self.at:
            self.level = min(self.room, self.level + (now - self.at) * self.room / self.period_s)
            self.at = now

    def wait_for(self, need: float, now: float) -> float:
        """Seconds until `need` can be taken (0: now; with a share of nothing, until it changes)."""
        self.refill(now)
        if self.room <= 0:
            return max(self.held_until - now, RECHECK_S)
        short = min(need, self.room) - self.level
        short = short if short > 1e-9 else 0.0  # (a refill timed to the need lands a rounding short)
        return max(self.held_until - now, short * self.period_s / self.room)

    def spend(self, need: float, now: float) -> None:
        self.level -= need

    def ended(self, generation: int, need: float, answered: bool) -> None:
        if answered:
            self.refusals = 0

    def credit(self, amount: float, generation: int) -> None:
        self.level = min(self.room, self.level + amount)

    def shared(self, per_period: float | None, now: float) -> None:
        """A new share: refilled at the old one until now. A larger share adds no level, only
        its refill: what it grows into was given up by others whose tries may have spent it
        at the meter already."""
        self.refill(now)
        self.share = per_period
        self.level = min(self.level, self.room)

    def announced(self, limit: float, remaining: float, reset_s: float | None, now: float,
                  sent_since: float) -> None:
        """What is left there bounds the level both ways: never more than announced (an answer
        overtaken by others is older than our own count), never less than announced less what
        our tries sent after the answered one took (the meter cannot have counted more of
        ours since). Bounded only from above, the level would only fall: what the meter never
        charged (a try it refused as too many at once) or refilled while an answer was on its
        way would stay unspent for good. The refill comes from the reset."""
        self.refill(now)
        self.size = limit
        if reset_s and remaining < limit:
            self.period_s = reset_s * limit / (limit - remaining)
        if self.share is not None:  # what remains there is every holder's: it only bounds ours
            self.level = min(self.level, remaining, self.room)
            return
        self.level = min(remaining, max(self.level, remaining - sent_since))

    def refused(self, retry_after_s: float | None, now: float, generation: int) -> None:
        """Empty until the `Retry-After`. Without one, it holds the time a try's refill takes (a
        request's, or a hundredth of the tokens), twice as long after each refusal in a row up
        to a quarter of the period, and refills only a try meanwhile: a few 429s instead of one
        per refill should the meter not refill as announced."""
        self.refill(now)
        self.level = min(self.level, 0.0)
        self.refusals += 1
        if retry_after_s is not None:
            self.held_until = max(self.held_until, now + retry_after_s)
            return
        a_try = max(self.period_s / max(self.room, 1.0), self.period_s / 100)
        self.held_until = max(self.held_until,
                              now + min(self.period_s / 4, a_try * 2 ** (self.refusals - 1)))
        self.at = max(self.at, self.held_until - a_try)


@dataclass
class PeriodBudget:
    """A budget metered per fixed period (see the module docstring): `size` a period; the
    current one ends by `ends`, maybe up to `margin` earlier, and nothing is sent in between
    (it might count in the next period); `level` what is left of it to us."""

    size: float
    period_s: float
    ends: float
    level: float
    taken: float  # this period's tries
    out: float  # ... of them not answered yet
    answered: float = 0.0  # answers since the period began, as the meter's announcements count them
    margin: float = 0.0
    answered_at: float = -math.inf
    next_at: float = -math.inf  # the pace: when the next try may go
    held_until: float = -math.inf
    generation: int = 0
    turns_seen: int = 0  # turns learned from the answers
    spill: float = 0.0  # tries of an earlier period answered in this one
    last: float = 0.0  # what the last answered try took

    def turn(self, now: float) -> None:
        """The period has turned by `now`: a fresh one."""
        if now >= self.ends:
            self.ends += (math.floor((now - self.ends) / self.period_s) + 1) * self.period_s
            self.begin()

    def begin(self) -> None:
        """A fresh period; this one's tries still out are the last one's."""
        self.generation += 1
        self.level, self.taken, self.out, self.spill, self.answered = self.size, 0.0, 0.0, 0.0, 0.0

    def wait_for(self, need: float, now: float) -> float:
        """Seconds until `need` can be taken: at the pace that spends the level evenly by the
        period's end, or once it turns when the level is short or its end is near."""
        self.turn(now)
        if self.level < min(need, self.size) - 1e-9 or now >= self.ends - self.margin:
            return max(self.held_until, self.ends) - now
        return max(self.held_until - now, self.next_at - now, 0.0)

    def spend(self, need: float, now: float) -> None:
        share = min(1.0, need / self.level) if self.level > 0 else 1.0
        self.next_at = max(self.next_at, now) + (self.ends - self.margin - now) * share
        self.level -= need
        self.taken += need
        self.out += need

    def ended(self, generation: int, need: float, answered: bool) -> None:
        """A try is back: no longer out; answered in a later period than it was counted in, the
        answers announced here count it, the meter does not."""
        if generation == self.generation:
            self.out = max(0.0, self.out - need)
        elif answered:
            self.spill += need
        if answered:
            self.answered += need
            self.last = need

    def credit(self, amount: float, generation: int) -> None:
        self.answered -= amount
        if generation == self.generation:
            self.level = min(self.size - self.taken + amount, self.level + amount)
            self.taken -= amount

    def announced(self, limit: float, remaining: float, reset_s: float | None, now: float,
                  sent_since: float) -> None:
        """What remains there, less this period's tries still out (counted here: `sent_since`
        adds nothing). More remaining than our answers since the period began leave (others'
        answers only leave less), beyond what answers overtaking each other explain, is a turn
        since the last answer: the next ends a period after now, maybe as much earlier as the
        turn may have come before now. A turn where nothing was sent (the period's last
        `margin`) leaves our tries out to the last period; an earlier one, unknown which of
        them went before it, to this one."""
        self.turn(now)
        self.size = limit
        if remaining > limit - self.answered + RISE * limit:
            since = self.answered_at
            if now >= self.ends - self.margin:
                since = max(since, self.ends - self.margin)
                self.begin()
                self.spill = self.last  # this answer's try, sent before the turn
            else:
                self.taken, self.spill = self.out, 0.0
            self.ends = now + self.period_s
            self.turns_seen += 1
            self.margin = min(max(now - since, MARGIN * self.period_s), self.period_s / 4)
            self.answered = limit - remaining
        self.level = min(self.size - self.taken, remaining - self.out + self.spill)
        self.answered_at = now

    def refused(self, retry_after_s: float | None, now: float, generation: int) -> None:
        """The meter's period is spent: nothing more until it turns (or the `Retry-After`). A
        refusal from a period already over says nothing of this one."""
        self.turn(now)
        if generation != self.generation:
            return
        self.taken, self.level = self.size, 0.0
        if retry_after_s is not None:
            self.held_until = max(self.held_until, now + retry_after_s)
