"""The gate: one request's pipeline, written once for every framework.

exempt client? -> route -> key -> cost -> check (awaited for an asyncio
limiter) -> hooks -> counters -> header fields or a 429 -> what to settle
after the response (``charge=``). An adapter (ASGI, WSGI, FastAPI, Django, DRF) builds a `Gate`
with the `View` of its requests, asks it about each request (`Gate.decide`,
or `Gate.decide_async` where ``gate.awaits``) and carries out the `Outcome`.

An `Outcome` is the tuple ``(admitted, decision, headers, body, due)``:

* ``admitted``: run the app (the limiter admitted the request, shadow mode
  let it through, or its route or client is exempt); else answer ``429`` with
  ``headers`` and ``body``;
* ``decision``: the limiter's `Decision` (None when exempt), for the
  adapter to leave on the request (``scope["nanobucket.decision"]``);
* ``headers``: ``(name, value)`` bytes pairs: the fields to add to the app's
  response when admitted, the 429's own when not;
* ``body``: the 429's ``application/problem+json`` body (None when admitted);
* ``due``: None, or what to settle once the response is known (``charge=``):
  ``due.settle(request, status)`` or ``await due.settle_async(request, status)``.

A plain tuple, not an object: one is made for every request, and a tuple
costs a fraction of an instance (the ASGI middleware's added cost stays
where it was before the gate, see ``benchmarks/callgrind.py``).

>>> import nanobucket as nb
>>> from nanobucket._http.views import ENVIRON
>>> gate = Gate(ENVIRON, nb.KeyedTokenBucket(rate=1, capacity=1), headers="legacy")
>>> admitted, decision, headers, body, due = gate.decide({"REMOTE_ADDR": "1.2.3.4"})
>>> admitted, headers[1], body, due
(True, (b'x-ratelimit-remaining', b'0'), None, None)
>>> gate.decide({"REMOTE_ADDR": "1.2.3.4"})[0], gate.counters.limited
(False, 1)
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypedDict

from .._compose import switch
from .._compose.hooks import Hook, LimitEvent, make_hooks
from .._core._limiter import traits
from .address import client_address
from .charge import Charge, Due, check_charge, settlers
from .clients import exempt_clients
from .counters import Counters, counters_or_new
from .policy import Policy, headers_mode, limit_headers, rejection
from .routes import Route, Rule, build_router
from .views import View

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ("EXEMPT", "READ", "Gate", "Options", "Outcome")

_NS = 1_000_000_000
ROUTE = "nanobucket.route"  # where the matched pattern is left on the request (`route`)
READ = object()  # decide_async(key=READ): the key is read from the request

#: ``(admitted, decision, headers, body, due)``: see the module docstring.
Outcome = tuple[bool, Any, Sequence[tuple[bytes, bytes]], "bytes | None", "Due | None"]
#: The outcome of a request on an exempt route or from an exempt client: the app
#: runs, nothing is added.
EXEMPT: Outcome = (True, None, (), None, None)


class Options(TypedDict, total=False):
    """The keyword options every HTTP integration takes alike (as the ASGI
    middleware documents them); each integration adds its own (key, cost, routes)."""

    headers: str  # "ietf" by default
    name: str  # "default" by default
    shadow: bool  # False by default
    counters: Counters | None
    keyed: bool | None
    on_decision: Hook | None
    on_limited: Hook | None
    charge: Charge | None
    exempt_clients: object  # addresses, networks, predicates: see `clients`


class Gate:
    """One configuration of the pipeline: a router, header mode, shadow, counters, hooks, charge.

    Built from an integration's arguments, all checked now (errors at
    startup): *limiter*, *key*, *cost*, *routes*, *exempt* and the `Options`
    as the middlewares take them; *locked*: threads may decide at once
    (counts are taken under the counters' lock); *asynchronous*: the adapter
    can await (else an ``async def`` hook is refused; the adapter refuses an
    asyncio limiter with its own advice).

    ``decide(request)`` runs it for a synchronous limiter (and plain hooks),
    ``decide_async(request)`` for any; ``awaits`` says whether the second is
    needed. *label* names the request to hooks when the adapter routes
    itself (the FastAPI route, the Django view); else the matched pattern.

    >>> import nanobucket as nb
    >>> from nanobucket._http.views import SCOPE
    >>> Gate(SCOPE, nb.TokenBucket(1, 1), headers="off")
    Gate(headers='off', shadow=False)
    """

    __slots__ = (
        "_charge",
        "_clients",
        "_default",
        "_hooks",
        "_hot",
        "_ietf",
        "_lock",
        "_match",
        "_method",
        "_note",
        "_path",
        "_peer",
        "_plain",
        "_quiet",
        "_settlers",
        "_simple",
        "awaits",
        "counters",
        "headers",
        "router",
        "shadow",
        "view",
    )

    def __init__(
        self,
        view: View,
        limiter: object,
        *,
        key: object = None,
        cost: object = 1,
        routes: Iterable[Route] | None = None,
        exempt: str | Iterable[str] | None = None,
        locked: bool = False,
        asynchronous: bool = True,
        **options: Unpack[Options],
    ) -> None:
        unknown = options.keys() - Options.__optional_keys__
        if unknown:
            raise TypeError(f"unexpected keyword argument {min(unknown)!r}")
        shadow = options.get("shadow", False)
        if not isinstance(shadow, bool):
            raise TypeError("shadow must be a bool")
        self.headers = headers_mode(options.get("headers", "ietf"))
        self.shadow = shadow
        self.counters = counters_or_new(options.get("counters"))
        self._hooks = make_hooks(
            options.get("on_decision"), options.get("on_limited"), allow_async=asynchronous
        )
        self._charge = check_charge(options.get("charge"))
        name = options.get("name", "default")
        router = build_router(limiter, key, cost, name, options.get("keyed"), routes, exempt)
        self.view = view
        self.router = router
        self._settlers = settlers(router) if self._charge is not None else {}
        # Exempt clients' addresses are read as the default key reads the client's.
        reads = router.default.key
        address = reads.client() if reads is not None else None
        self._clients = exempt_clients(options.get("exempt_clients"), address or client_address())
        self._quiet = shadow or self.headers == "off"
        self._ietf = self.headers == "ietf"
        self._lock = self.counters._lock if locked else None
        # The view's readers, looked up once (a mapping's may be C callables).
        self._peer, self._path, self._method, self._note = (
            view.peer,
            view.path,
            view.method,
            view.note,
        )
        # With no routes every request takes the default rule: no matching.
        self._simple = not router.exact and not router.prefixes
        self._match = router.match
        self._default = router.default
        rules = [router.default, *(r for group in router.exact.values() for _, r in group)]
        rules += [r for _, _, r in router.prefixes]
        self.awaits = (
            any(p.is_async for p in router.policies())
            or any(r.key is not None and r.key.awaits for r in rules)
            or (self._hooks is not None and self._hooks.awaited)
        )
        # The hot case, which `decide` takes in a few steps: a `Rule.plain`
        # (keyed by the peer at a fixed cost), nothing but the
        # IETF fields or none to add, nothing to call or settle (a lock only to count).
        self._plain = (
            self._hooks is None and self._charge is None and not shadow and self.headers != "legacy"
        )
        # Every request takes one plain rule: `decide` goes straight to the hot case.
        hot = self._simple and self._plain and self._default.plain and self._clients is None
        self._hot: Rule | None = self._default if hot else None

    def refuse_blocking(self, where: str) -> None:
        """Raise TypeError if a limiter of the gate waits on the network in the calling
        thread (``blocking = True``, as `RedisTokenBucket`): on an event loop (*where*)
        every decision would stall every request the loop serves.

        >>> import nanobucket as nb
        >>> from nanobucket._http.views import SCOPE
        >>> Gate(SCOPE, nb.KeyedTokenBucket(1, 1)).refuse_blocking("an ASGI app")
        """
        for policy in self.router.policies():
            for limiter in (policy.limiter, *policy.leaves):
                if traits(limiter).blocking:
                    raise TypeError(
                        f"{type(limiter).__name__} waits for Redis in the calling thread: in "
                        f"{where} every decision would block the event loop, and every "
                        "request on it; use nanobucket.redis.AsyncRedisTokenBucket (the same "
                        "arguments, an asyncio client), or an in-process or shared-memory limiter"
                    )

    def rule(self, request: Any) -> Rule:
        """The rule *request* takes; its pattern is left on the request (an exempt one counted).

        >>> import nanobucket as nb
        >>> from nanobucket._http.views import ENVIRON
        >>> gate = Gate(ENVIRON, nb.TokenBucket(1, 1), exempt="/healthz")
        >>> environ = {"PATH_INFO": "/healthz"}
        >>> gate.rule(environ).exempt, environ["nanobucket.route"], gate.counters.exempt
        (True, '/healthz', 1)
        """
        if self._simple:
            return self._default
        rule = self._match(self._path(request), self._method(request))
        self._note(request, ROUTE, rule.pattern)
        if rule.exempt:
            self._count("exempt")
        return rule

    def decide(
        self,
        request: Any,
        peer: str | None = None,
        label: str | None = None,
        path: str | None = None,
    ) -> Outcome:
        """Decide *request* with a synchronous limiter: its `Outcome` (hooks called, counted).

        *peer* is the request's socket peer when the adapter has it at hand
        (``view.peer(request)`` otherwise): every request's default key reads it.
        *path*, likewise, is ``view.path(request)`` when the adapter read it.

        >>> import nanobucket as nb
        >>> from nanobucket._http.views import SCOPE
        >>> gate = Gate(SCOPE, nb.KeyedTokenBucket(rate=1, capacity=2))
        >>> gate.decide({"client": ("1.2.3.4", 5)})[2]
        ((b'ratelimit-policy', b'"default";q=2;w=2'), (b'ratelimit', b'"default";r=1;t=1'))
        """
        if switch.off:  # limits turned off (a test run): admitted, nothing decided
            return EXEMPT
        rule = self._hot
        if rule is None:
            clients = self._clients
            if clients is not None and clients.exempts(self.view, request):
                self._count("exempt")
                return EXEMPT
            if self._simple:
                rule = self._default
            else:  # `rule`, inlined
                # Local names: a callable in a slot is called faster from one.
                match, note = self._match, self._note
                rule = match(self._path(request) if path is None else path, self._method(request))
                note(request, ROUTE, rule.pattern)
                if rule.exempt:
                    self._count("exempt")
                    return EXEMPT
            if not (rule.plain and self._plain):  # every step
                policy = rule.policy
                assert policy is not None  # only exempt rules have none
                cost = (
                    rule.cost
                    if rule.cost_fn is None
                    else policy.validated_cost(rule.cost_fn(request))
                )
                if rule.peer_key:  # the default key, inlined: the peer's address as it is for IPv4
                    key = self._peer(request) if peer is None else peer
                    if not key or ":" in key:
                        key = rule.key.peer_key(key)  # type: ignore[union-attr]
                else:
                    key = rule.key.read(self.view, request)  # type: ignore[union-attr]
                decision = policy.check(key, cost)
                if self._hooks is not None:
                    self._hooks.emit(
                        LimitEvent(key, label or rule.pattern, cost, decision, self.shadow)
                    )
                return self._outcome(policy, key, cost, decision)
        # The hot case: the steps above, for a `Rule.plain` and no more to do.
        # The rule's policy (no exempt rule is plain).
        bucket: Policy = rule.policy  # type: ignore[assignment]
        key = self._peer(request) if peer is None else peer
        if not key or ":" in key:  # IPv6, or no address (a unix socket)
            key = rule.key.peer_key(key)  # type: ignore[union-attr]
        check = bucket.check
        decision = check(key, rule.cost)
        if not decision.allowed:
            return self._outcome(bucket, key, rule.cost, decision)
        lock = self._lock
        if lock is None:
            self.counters.admitted += 1
        else:
            with lock:  # threads (WSGI, Django): no count lost between read and write
                self.counters.admitted += 1
        if not self._ietf:
            return (True, decision, (), None, None)
        if bucket.composite is not None:  # `limit_headers` for a composite, inlined
            _, r_prefix, field = bucket.fields(decision)  # the binding bucket's
            reset = -(-decision.reset_after_ns // _NS)
            value = b"%b%d;t=%d" % (r_prefix, decision.remaining, reset)
            if field is None:
                return (True, decision, [(b"ratelimit", value)], None, None)
            return (True, decision, [field, (b"ratelimit", value)], None, None)
        # `limit_headers` for one bucket, inlined: keep the two alike.
        w = bucket.watched
        if w is not None and (w.rate is not bucket.rate_seen or w.capacity != bucket.capacity_seen):
            bucket.refresh()  # the limiter was reconfigured: new RateLimit-Policy
        value = b"%b%d;t=%d" % (
            bucket.r_prefix,
            decision.remaining,
            -(-decision.reset_after_ns // _NS),
        )
        header = bucket.policy_header
        if header is None:
            return (True, decision, ((b"ratelimit", value),), None, None)
        return (True, decision, (header, (b"ratelimit", value)), None, None)

    async def decide_async(
        self, request: Any, label: str | None = None, *, key: Any = READ, cost: int | None = None
    ) -> Outcome:
        """`decide`, awaiting an asyncio limiter, an ``async def`` key or hook.

        *key* and *cost*, when given, were found by the adapter (FastAPI's
        dependencies); *cost* is checked against the limiter here.

        >>> import asyncio, nanobucket as nb
        >>> from nanobucket._http.views import SCOPE
        >>> gate = Gate(SCOPE, nb.KeyedTokenBucket(rate=1, capacity=3))
        >>> asyncio.run(gate.decide_async({}, key="alice", cost=2))[1].remaining
        1
        """
        if switch.off:  # limits turned off (a test run): admitted, nothing decided
            return EXEMPT
        clients = self._clients
        if clients is not None and clients.exempts(self.view, request):
            self._count("exempt")
            return EXEMPT
        rule = self._default if self._simple else self.rule(request)
        if rule.exempt:
            return EXEMPT
        policy = rule.policy
        assert policy is not None  # only exempt rules have none
        if cost is not None:
            cost = policy.validated_cost(cost)
        elif rule.cost_fn is not None:
            cost = policy.validated_cost(rule.cost_fn(request))
        else:
            cost = rule.cost
        if key is READ:
            reads = rule.key
            assert reads is not None
            if reads.awaits:
                key = await reads.read_async(self.view, request)
            else:
                key = reads.read(self.view, request)
        decision = policy.check(key, cost)
        if policy.is_async:
            decision = await decision
        hooks = self._hooks
        if hooks is not None:
            event = LimitEvent(key, label or rule.pattern, cost, decision, self.shadow)
            if hooks.awaited:
                await hooks.emit_async(event)
            else:
                hooks.emit(event)
        return self._outcome(policy, key, cost, decision)

    def _outcome(self, policy: Policy, key: Hashable, cost: int, decision: Any) -> Outcome:
        """Count *decision* and make its `Outcome`: the fields, or the 429."""
        if decision.allowed:
            lock = self._lock
            if lock is None:
                self.counters.admitted += 1
            else:
                with lock:
                    self.counters.admitted += 1
            charge = self._charge
            due = None if charge is None else Due(charge, self._settlers[id(policy)], key, cost)
            if self._quiet:
                return (True, decision, (), None, due)
            fields: Sequence[tuple[bytes, bytes]] = limit_headers(self.headers, policy, decision)
            return (True, decision, fields, None, due)
        if self.shadow:
            self._count("shadow_limited")
            return (True, decision, (), None, None)  # never charged
        self._count("limited")
        fields, body = rejection(self.headers, policy, decision)
        return (False, decision, fields, body, None)

    def _count(self, name: str) -> None:
        counters = self.counters
        lock = self._lock
        if lock is None:
            setattr(counters, name, getattr(counters, name) + 1)
        else:
            with lock:
                setattr(counters, name, getattr(counters, name) + 1)

    def __repr__(self) -> str:
        return f"Gate(headers={self.headers!r}, shadow={self.shadow})"
