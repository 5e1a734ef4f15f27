# The Cython twin of _bucket_py: the same names with the same signatures (the
# differential tests hold it to that), so its types are the twin's. Only
# re-exports here, so nothing can drift from the typed pure-Python module.
from ._bucket_py import Decision as Decision
from ._bucket_py import KeyedTokenBucket as KeyedTokenBucket
from ._bucket_py import TokenBucket as TokenBucket
