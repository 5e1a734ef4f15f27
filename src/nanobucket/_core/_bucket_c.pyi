# The Cython twin of _bucket_py: the same names with the same signatures (the
# differential tests hold it to that), so its types are the twin's. Only
# re-exports here, so nothing can drift from the typed pure-Python module,
# but for AllowAll, which only the Cython module has.
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from ._bucket_py import Decision as Decision
from ._bucket_py import KeyedTokenBucket as KeyedTokenBucket
from ._bucket_py import TokenBucket as TokenBucket

# Cython only: `nanobucket.layered.AllOf.allow` in one call (see _bucket_c.pyx).
class AllowAll:
    keyed: bool
    @staticmethod
    def of(
        layers: Sequence[Any],
        missing_key: Callable[[], object] | None,
        layered: type[Decision] | None = None,
    ) -> AllowAll | None: ...
    def allow(self, key: Hashable | None = None, cost: int = 1) -> bool: ...
    def check(self, key: Hashable | None = None, cost: int = 1) -> Any: ...
