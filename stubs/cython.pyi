# What mypy sees of Cython's pure-Python mode (the router's compiled modules: services/router/setup.py).
#
# Cython's own Shadow.py types cython.declare(object) as returning an ``object``; the modules declare a
# field as ``name: PythonType = cython.declare(CType, ...)``, where Cython reads the C type and mypy the
# annotation, so here declare() returns Any. Only the names those modules use are listed.
from typing import Any, TypeVar

_T = TypeVar("_T")

compiled: bool

int: Any
bint: Any
double: Any
Py_ssize_t: Any

def declare(t: Any = ..., value: Any = ..., **kwds: Any) -> Any: ...
def cclass(cls: _T) -> _T: ...
def ccall(func: _T) -> _T: ...
def cfunc(func: _T) -> _T: ...
def boundscheck(on: bool) -> Any: ...
def wraparound(on: bool) -> Any: ...
def locals(**types: Any) -> Any: ...
def returns(t: Any) -> Any: ...

longlong: Any
Py_UCS4: Any
