"""A hedged request's first attempt, sans I/O: raced against the next candidate's.

Where the loop would make a candidate's attempts, a request of a hedged route
that may be hedged (`hedging.may_hedge`) yields a `Race` instead: its first
branch is those attempts; its second, started by the shell after the delay
when the first has not ended the race, admits the next candidate that takes it
(skipping suspended ones, as the loop does) and makes one attempt there, if the
route's budget pays for it. Each branch records its own verdict and lets go of
its own admission, on its own copy of the request's `Run`; the counts are
merged back once the race is over, and the loop goes on from there.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Generator
from typing import Any

from .._state.protocol import Admission, Ticket
from ..logging import emit
from .attempts import Attempting
from .candidates import Candidacy
from .effects import NOT_RUN, Call, Race, Raced
from .hedging import Allowance, HedgeState, ends_race, hedge_delay, may_hedge
from .routes import CompiledTarget
from .run import SUCCESS, Outcome, Run

__all__ = ["Hedged"]

# What a branch of a race comes to: the outcome of its attempt (None: the hedge found no
# candidate to take it) and the index of the candidate it reached.
Branch = tuple[Outcome | None, int]


def _ends(value: Branch) -> bool:
    return value[0] is not None and ends_race(value[0])


def _goes_on(run: Run, branch: Run) -> None:
    """The loop's `run` takes on what its loop reads of the branch whose outcome goes on:
    when its attempt was sent (a close since then cuts the request short), and its result."""
    run.sent_at, run.closes_seen = branch.sent_at, branch.closes_seen
    run.result, run.injected = branch.result, branch.injected


class Hedged(Candidacy, Attempting):
    """The attempts on one candidate, judged; and, for a hedged request, raced."""

    # `Watching`'s: `probe.admitted` for an attempt that is a scope's probe.
    _admitted: Callable[[Run, CompiledTarget, Ticket], None]

    def _admission(
        self, run: Run, index: int, target: CompiledTarget
    ) -> Generator[Any, Any, Admission]:
        """Candidate `index` asked of the store (an effect over a blocking one); a refusal
        is told here. The loop's, and a hedge's."""
        self._candidate(run, index, target)
        facts = self._scope_facts(run, target)
        now = self.clock()
        admission: Admission
        if self._blocking:
            lease = self._lease(run, run.sent)
            admission = yield Call("admit", (facts, self.breaker, now, lease))
        else:
            admission = self.store.admit(facts, self.breaker, now)
        if admission.ticket is None:
            self._refused(run, target, admission, now)
        return admission

    def _judged_attempt(
        self, run: Run, target: CompiledTarget, sent: Any, ticket: Ticket
    ) -> Generator[Any, Any, Outcome]:
        """The candidate's attempts, and their verdict recorded (or left to the body's end).

        Should recording fail (a store, a logger, a cancellation), the answer it
        holds is closed before the error goes on; the admission is the caller's.
        """
        if run.policy.max_attempts_per_target == 1:
            run.attempts += 1
            attempt = self._watched_attempt if run.watched else self._attempt
            outcome = yield from attempt(run, target, sent, ticket)
        else:
            outcome = yield from self._try_target(run, target, sent, ticket)
        try:
            run.tried += 1
            route = run.cands.route
            if route is not None:
                if route.avoid_rate_limits:
                    outcome = self._avoid_rate_limit(outcome)
                if route.hedging is not None and outcome.committed:
                    # the target's time to first token, for an adaptive delay
                    route.hedging.times(target.name).add(self.clock() - run.sent_at)
            if outcome.deferred:
                pass  # the body's end, or its failure, will be the verdict
            elif outcome.verdict is SUCCESS and not self._blocking and not run.injected:
                self._succeeded(ticket, target, run)
            else:
                yield from self._record(ticket, outcome.verdict, target, run)
        except BaseException:
            yield from self._discard(outcome.result)
            raise
        return outcome

    def _hedge_plan(self, run: Run, index: int) -> tuple[float, HedgeState] | None:
        """The delay before a hedge of `run`'s attempt on candidate `index`, and its route's
        hedge state; None when it is not hedged (`hedging.may_hedge`, the delay unknown).

        Only a request's first attempt is hedged. A request that may be hedged
        puts its share in the route's budget here, whether a hedge is sent or not.
        """
        route = run.cands.route
        if route is None or route.hedging is None or run.tried or run.passed >= 0:
            return None
        cands = run.cands
        holds = run.holds_state
        if holds is None:
            holds = run.holds_state = bool(cands.others) and (
                cands.pinned or (bool(run.body) and self._names_state(run))
            )
        policy = run.policy
        refused = may_hedge(
            run.request.method,
            run.request.headers,
            retry_ambiguous=policy.retry_ambiguous,
            replayable=run.body is not None,
            holds_state=holds,
            others=len(cands.targets) - index - 1,
        )
        if refused is not None or policy.max_total_attempts < 2:
            return None
        state = route.hedging
        state.budget.deposit()
        delay = hedge_delay(state.hedge, state.times(cands.targets[index].name))
        if delay is None:
            return None
        if run.deadline is not None and self.clock() + delay >= run.deadline:
            return None  # the request would be out of time before the hedge started
        return delay, state

    def _raced(
        self,
        run: Run,
        index: int,
        target: CompiledTarget,
        sent: Any,
        ticket: Ticket,
        plan: tuple[float, HedgeState],
    ) -> Generator[Any, Any, tuple[Outcome, CompiledTarget, int]]:
        """The attempt on candidate `index`, raced by a hedge on the next after the plan's
        delay: the outcome the loop goes on with, and its candidate and index.

        The loser (cancelled) recorded nothing and let go of its admission; a
        failure that lost records itself and is closed here. When both fail,
        the hedge's failure is the one kept (the later candidate), and the loop
        goes on after the candidate the hedge reached (`Run.passed`).
        """
        delay, state = plan
        attempts, tried = run.attempts, run.tried
        skipped, excluded = len(run.skipped), len(run.excluded)
        # Each branch has a run of its own, so neither writes what the other (or the loop,
        # once the race is over: a sync loser's thread ends later) reads; the loop's run
        # takes the counts of both, and the rest from the one whose outcome goes on.
        mine = copy.copy(run)
        other = copy.copy(run)
        other.last = other.last_target = other.received = other.aloft = None
        other.admission, other.injected = None, None
        # numbered after the first's attempt (a single one, unless it retries its target)
        other.attempts = hedge_base = attempts + 1
        # the attempts left after the first's, for the first's retries and the hedge alike
        mine.allowance = other.allowance = Allowance(run.policy.max_total_attempts - hedge_base)

        asked: list[bool] = []  # the delay ran out: whether the budget paid for a hedge

        def second() -> Generator[Any, Any, Branch] | None:
            paid = state.budget.withdraw()
            asked.append(paid)
            if paid:
                return self._hedge(other, index + 1, state, delay)
            self._told(run, index, "refused_budget", None, delay)  # now: the first goes on
            return None

        raced = yield Race(
            self._first(mine, index, target, sent, ticket), second, delay, _ends, self._lost
        )
        if asked and asked[0]:
            self._told_raced(run, index, raced, delay, other.passed)
        run.attempts += mine.attempts - attempts
        run.tried += mine.tried - tried
        run.streams = mine.streams
        if raced.started:
            run.hedged = other.attempts > hedge_base  # (its attempt sent, not just looked for)
            run.attempts += other.attempts - hedge_base
            run.tried += other.tried - tried
            run.skipped += other.skipped[skipped:]
            run.excluded += other.excluded[excluded:]
        first, hedge = raced.results
        if raced.winner == 1 and first is NOT_RUN and state.hedge.adaptive is not None:
            # the first attempt, cancelled, had no first token after the delay: kept as the
            # delay (left out, the percentile would be of the fast ones; kept as its whole
            # wait, each hedge won would push the next delay later, without end)
            state.times(target.name).add(delay)
        if raced.winner == 1 or (raced.winner is None and hedge is not NOT_RUN and hedge[0]):
            # the hedge's outcome goes on; the first's, if it came, is a failure that lost
            if first is not NOT_RUN:
                yield from self._lost(first)
            outcome, reached = hedge
            _goes_on(run, other)
            run.passed = reached
            targets = run.cands.targets
            return outcome, targets[reached], reached
        if hedge is not NOT_RUN:
            yield from self._lost(hedge)
            run.passed = hedge[1]  # the candidates it reached were refused: not asked again
        _goes_on(run, mine)
        return first[0], target, index

    def _told_raced(self, run: Run, index: int, raced: Raced, delay: float, sent_to: int) -> None:
        """`hedge.finished` for a race with a hedge paid for: what came of it (`sent_to`:
        the candidate the hedge was sent to, if it got that far)."""
        hedge = raced.results[1]
        if hedge is not NOT_RUN and hedge[0] is None:
            return  # no candidate took the hedge: told as it found none (`_hedge`)
        if raced.winner == 1:
            outcome = "won"
        elif raced.winner == 0:
            outcome = "lost"
        else:
            outcome = "failed"
        self._told(run, index, outcome, sent_to if sent_to > index else None, delay)

    def _told(self, run: Run, index: int, outcome: str, sent_to: int | None, delay: float) -> None:
        """`hedge.finished`: the request's hedge delay ran out, and `outcome` came of it."""
        targets = run.cands.targets
        emit(
            "hedge.finished",
            route=run.route_name,
            target=targets[index].name,
            hedge=None if sent_to is None else targets[sent_to].name,
            outcome=outcome,
            delay_s=delay,
        )

    def _first(
        self, run: Run, index: int, target: CompiledTarget, sent: Any, ticket: Ticket
    ) -> Generator[Any, Any, Branch]:
        """The race's first branch: the attempts on the candidate the loop admitted."""
        try:
            outcome = yield from self._judged_attempt(run, target, sent, ticket)
        except BaseException:
            yield from self._let_go(ticket)  # cancelled (it lost), or failed: no verdict
            raise
        return outcome, index

    def _hedge(
        self, run: Run, start: int, state: HedgeState, delay: float
    ) -> Generator[Any, Any, Branch]:
        """The race's second branch: the first candidate from `start` that takes the
        request (the others skipped, as the loop skips them; none past a pool member
        whose announced rate limits leave no room), and one attempt there. None for
        its outcome when none takes it: the hedge paid for is given back."""
        targets = run.cands.targets
        reached = start - 1
        for index in range(start, len(targets)):
            if run.deadline is not None and self.clock() >= run.deadline:
                break
            members = run.cands.members
            if members is not None and not members[index].has_room(self.clock()):
                # a pool member its announced rate limits leave no room on: no hedge (and
                # the loop may still fail over to it, once its window has come back)
                break
            reached = index
            target = targets[index]
            admission = yield from self._admission(run, index, target)
            ticket = admission.ticket
            if ticket is None:
                continue
            try:
                if ticket.probes and run.watched:
                    self._admitted(run, target, ticket)
                if admission.transitions:
                    self._announce(admission.transitions, target, run)
                if admission.refusal is not None:
                    self._observe_skip(run, target, admission)
                if not run.allowance.take():
                    # the first's retries in place spent the request's attempts: no hedge
                    # (and the candidate, not tried, is not passed over by the loop)
                    yield from self._let_go(ticket)
                    reached = index - 1
                    break
                run.passed = index  # (what `hedge.finished` names)
                outcome = yield from self._judged_attempt(run, target, run.sent, ticket)
            except BaseException:
                yield from self._let_go(ticket)
                raise
            return outcome, index
        state.budget.refund()
        self._told(run, start - 1, "no_candidate", None, delay)  # now: the first goes on
        return None, reached

    def _lost(self, value: Branch) -> Generator[Any, Any, None]:
        """Close what a branch's result holds: it is not the one the request goes on with."""
        outcome = value[0]
        if outcome is not None:
            yield from self._discard(outcome.result)
