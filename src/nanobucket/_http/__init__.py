"""What every HTTP integration shares: the gate, and the keys, routes and fields it uses.

What it holds, one module per concern:

* `views`: how the gate reads one framework's requests (`View`), and
  `KeyFunc`, a key read through a view;
* `address`, `keys`: the ready-made keys (`client_address`, `header`, `route`);
* `routes`: `Route` rules and the `Router` that finds a request's rule;
* `policy`: a limiter as the gate uses it, its header fields and 429 bodies;
* `counters`: `Counters`;
* `answer`: `HttpAnswer`, the fields and the 429 for an integration written by hand;
* `clients`: the clients never limited (``exempt_clients=``);
* `websocket`: a refused websocket handshake, and `MessageLimit`;
* `gate`: the pipeline itself (`Gate.decide` -> an `Outcome`);
* `charge`: ``charge=``, a cost known only when the response ends;
* `django`, `drf`: what Django's middleware, view decorator and DRF throttle share.

The adapters (`nanobucket.asgi`, `nanobucket.wsgi`, `nanobucket.fastapi`,
`nanobucket.django`) turn their request into the gate's view and its
outcome into their response.

What it may import: ``nanobucket._core`` and ``nanobucket._compose``.

>>> import nanobucket as nb
>>> from nanobucket._http import ENVIRON, Gate
>>> gate = Gate(ENVIRON, nb.TokenBucket(rate=1, capacity=5))
>>> admitted, decision, fields, body, due = gate.decide({"REMOTE_ADDR": "1.2.3.4"})
>>> admitted, fields[1], body
(True, (b'ratelimit', b'"default";r=4;t=1'), None)
"""

from .address import client_address
from .answer import HttpAnswer
from .counters import Counters, counters_or_new
from .gate import EXEMPT, READ, Gate, Options, Outcome
from .keys import bounded, header, key_func, route
from .policy import (
    HEADER_MODES,
    Policy,
    headers_mode,
    keyed_of,
    limit_headers,
    problem_body,
    rejection,
    retry_after_seconds,
)
from .routes import Route, Router, Rule, build_router, path_name, suspect_path
from .views import (
    ENVIRON,
    SCOPE,
    WS_SCOPE,
    AiohttpView,
    EnvironView,
    KeyFunc,
    ScopeView,
    View,
    cgi_name,
    wsgi_path,
)
from .websocket import MessageLimit, refuse_handshake

# The names the integrations (and their tests) import from here.
__all__ = (
    "ENVIRON",
    "EXEMPT",
    "HEADER_MODES",
    "READ",
    "SCOPE",
    "WS_SCOPE",
    "AiohttpView",
    "Counters",
    "EnvironView",
    "Gate",
    "HttpAnswer",
    "KeyFunc",
    "MessageLimit",
    "Options",
    "Outcome",
    "Policy",
    "Route",
    "Router",
    "Rule",
    "ScopeView",
    "View",
    "bounded",
    "build_router",
    "cgi_name",
    "client_address",
    "counters_or_new",
    "header",
    "headers_mode",
    "key_func",
    "keyed_of",
    "limit_headers",
    "path_name",
    "problem_body",
    "refuse_handshake",
    "rejection",
    "retry_after_seconds",
    "route",
    "suspect_path",
    "wsgi_path",
)
