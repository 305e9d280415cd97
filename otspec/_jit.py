"""Optional numba compilation of the package's scalar kernels (the ``fast`` extra), in one place.

A kernel module writes its loops in plain Python on scalars and calls
:func:`compile_in` on its own globals: with numba installed the named
functions are replaced by their ``njit`` versions (rebinding the module
globals, so compiled kernels call compiled helpers); without it nothing
changes and the module runs as CPython (or uses a vectorised fallback).

One compilation per kernel where the arguments differ only in ways that do not change the code: numba compiles a
function once for every tuple of argument types it meets, and an array's type includes whether it is read-only
(a law held in a frozen result, a view handed out read-only) and an integer's its width (a numpy ``int32`` scalar).
The same kernel called with a writeable and a read-only row, or with ``int64`` and ``int32`` counts, was compiled
two or four times over (each a second or more of a cold run, in every process that reaches it). The dispatchers
made here type every array argument that the kernel never writes as read-only (a writeable array converts safely
to it; the compiled code is the same, the read-only flag only forbids writes at typing) and every signed integer
scalar as ``int64``, and map the types actually met onto that one compilation. Whether a kernel writes an argument
is read from its source (:func:`written_arguments`): a subscript assigned through it or through a name made from
it, a call that may write it (a compiled helper that writes the matching parameter, a method of the array, any
call not known to only read), or its return. That reading may call an argument written that is not (then nothing
is saved), never the reverse: numba's typing refuses a write through a read-only array, and a kernel whose
read-only typing fails anyway is compiled for the types as met (:class:`_Dispatcher` falls back, once per process).
"""

from __future__ import annotations

import ast
import builtins
import functools
import inspect
import math
import textwrap

try:  # pragma: no cover - exercised when the ``fast`` extra is installed
    import numba as _numba
    from numba.core import errors as _errors
    from numba.core import sigutils as _sigutils
    from numba.core import types as _types
    from numba.core.registry import CPUDispatcher as _CPUDispatcher
except ImportError:  # pragma: no cover
    _numba = None
    _CPUDispatcher = object

import numpy as np

#: Whether numba is installed.
HAVE_NUMBA = _numba is not None
#: The kernels whose one signature failed to type (a write :func:`written_arguments` missed), each with that
#: signature, in this process: compiled for the types as met instead. Empty in the test suite.
REFUSED: list = []

#: Calls that only read their array arguments: the builtins used on arrays and scalars in the kernels, and numpy's
#: and math's functions (numpy's writing ones, and any call given ``out=``, excepted below).
_READING_BUILTINS = frozenset({"len", "range", "min", "max", "abs", "float", "int", "bool", "enumerate", "zip",
                               "round", "divmod", "isinstance", "print"})
_WRITING_NUMPY = frozenset({"copyto", "put", "place", "putmask", "fill_diagonal", "put_along_axis"})
#: numpy's functions that return a new array or a scalar (never a view of an argument).
_NEW_ARRAY_NUMPY = frozenset({"empty", "zeros", "ones", "full", "arange", "empty_like", "zeros_like", "ones_like",
                              "full_like", "copy", "array", "sqrt", "exp", "log", "log1p", "expm1", "abs", "isnan",
                              "isfinite", "float64", "int64", "int32", "bool_", "uint8", "int8"})
#: Array methods that return a new value and write nothing (any other method, ``fill``, ``sort``, ..., may write).
_READING_METHODS = frozenset({"copy", "sum", "max", "min", "argmax", "argmin", "any", "all", "mean", "prod",
                              "cumsum", "argsort", "astype", "item", "nonzero", "dot"})
#: Array methods that return a view of the array and write nothing (the view is followed as the array).
_VIEW_METHODS = frozenset({"view", "reshape", "ravel", "transpose", "squeeze", "swapaxes"})


def _root(node):
    """The name a subscript, attribute or starred expression reads through (``x`` of ``x[i].y[j]``), else None."""
    while isinstance(node, (ast.Subscript, ast.Attribute, ast.Starred)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _ndim(node, ndims):
    """The number of axes of the value of ``node`` (a name of known axes, or an index of one), else None."""
    if isinstance(node, ast.Name):
        return ndims.get(node.id)
    if isinstance(node, ast.Subscript):
        axes = _ndim(node.value, ndims)
        index = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if axes is None or any(isinstance(e, ast.Starred) for e in index):
            return None
        dropped = sum(not isinstance(e, ast.Slice) for e in index)
        return axes - dropped if axes >= dropped else None
    return None


def _view_roots(node, namespace, ndims, seen=None) -> set:
    """The names whose arrays the value of ``node`` may be (or be a view of): ``x``, ``x[a:b]``, ``x[i]`` of a
    ``x`` with more axes than indices or of unknown axes (``ndims``: the numbers of axes of the names, where
    known), ``x.T``, ``x.reshape(..)``, a tuple or a conditional of such, any call's arguments but those of a call
    known to return a new array or a scalar (a helper of ``namespace`` returns a view of its arguments at the
    positions :func:`written_arguments` gives it, nothing else). An arithmetic expression makes a new value."""
    def roots(e):
        return _view_roots(e, namespace, ndims, seen)

    if isinstance(node, ast.Name):
        return {node.id}
    if isinstance(node, ast.Subscript):
        index = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        axes = _ndim(node.value, ndims)
        view = any(isinstance(e, ast.Slice) for e in index) or axes is None or axes > len(index)
        return roots(node.value) if view else set()
    if isinstance(node, ast.Attribute):
        return set() if node.attr in ("shape", "size", "ndim", "dtype") else roots(node.value)
    if isinstance(node, (ast.Starred, ast.NamedExpr)):
        return roots(node.value)
    if isinstance(node, (ast.Tuple, ast.List)):
        return set().union(*(roots(e) for e in node.elts))
    if isinstance(node, ast.IfExp):
        return roots(node.body) | roots(node.orelse)
    if isinstance(node, ast.Call):
        f = node.func
        if isinstance(f, ast.Name) and f.id in _READING_BUILTINS and f.id not in namespace:
            return set()
        if isinstance(f, ast.Attribute) and f.attr in _READING_METHODS:
            return set()
        if (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name)
                and (namespace.get(f.value.id) is math
                     or namespace.get(f.value.id) is np and f.attr in _NEW_ARRAY_NUMPY)):
            return set()
        inner = _callee(f, namespace)
        if inner is not None and not node.keywords and not any(isinstance(a, ast.Starred) for a in node.args):
            returned = written_arguments(inner, namespace, _call_ndims(node, ndims), _seen=seen)
            return set().union(*(roots(a) for j, a in enumerate(node.args) if j in returned))
        found = set().union(*(roots(a) for a in node.args), *(roots(k.value) for k in node.keywords))
        return found | (roots(f.value) if isinstance(f, ast.Attribute) else set())
    return set()


def _call_ndims(call, ndims) -> tuple:
    """The numbers of axes of a call's positional arguments, -1 where not known."""
    return tuple(-1 if (d := _ndim(a, ndims)) is None else d for a in call.args)


def _callee(func, namespace):
    """The plain Python function a call's target names in ``namespace`` (a compiled one's ``py_func``), else None."""
    if isinstance(func, ast.Name):
        f = namespace.get(func.id)
        f = getattr(f, "py_func", f)
        return f if inspect.isfunction(f) else None
    return None


def _reads_only(func, namespace) -> bool:
    """Whether a call of ``func`` (not a kernel of ``namespace``) is known to write none of its array arguments."""
    if isinstance(func, ast.Name):
        return func.id in _READING_BUILTINS and func.id not in namespace and hasattr(builtins, func.id)
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        module = namespace.get(func.value.id)
        if module is np:
            return func.attr not in _WRITING_NUMPY
        return module is math
    return False


def _writes(nodes, names, namespace, ndims, seen) -> bool:
    """Whether the statements and expressions ``nodes`` (of a function's body) may write an array held by one of
    ``names``, hand it to code that may, or return it."""
    for node in nodes:
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store) and _root(node) in names:
            return True
        if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name) and node.target.id in names:
            return True                                     # ``y += ..`` on an array is in place
        if isinstance(node, ast.Return) and node.value is not None and _view_roots(node.value, namespace, ndims, seen) & names:
            return True
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Attribute) and _root(f.value) in names and f.attr not in _READING_METHODS | _VIEW_METHODS:
            return True                                     # a method of the array itself (``fill``, ``sort``)
        hit = [j for j, a in enumerate(node.args) if _view_roots(a, namespace, ndims, seen) & names]
        hit += [k.arg for k in node.keywords if _view_roots(k.value, namespace, ndims, seen) & names]
        if not hit:
            continue
        if any(k.arg in (None, "out") for k in node.keywords) or any(isinstance(a, ast.Starred) for a in node.args):
            return True                                     # ``out=``, or arguments unpacked: positions unknown
        inner = _callee(f, namespace)
        if inner is None:
            if not _reads_only(f, namespace):
                return True
            continue
        params = inner.__code__.co_varnames[:inner.__code__.co_argcount]
        at = [params.index(j) if isinstance(j, str) and j in params else j for j in hit]
        if any(isinstance(j, str) for j in at) or set(at) & written_arguments(inner, namespace, _call_ndims(node, ndims),
                                                                                  _seen=seen):
            return True
    return False


def written_arguments(func, namespace=None, ndims=(), _seen=None) -> frozenset:
    """The positions of ``func``'s parameters that it may write, hand to code that may, or return (or a view of).

    Read from the source of ``func`` (a plain Python function), with ``namespace`` (default: its globals) naming
    the helpers it calls, whose written parameters are read the same way, recursively (given the axes of the
    arguments where known); ``ndims``: the number of axes of each parameter (by position; 0 for a scalar, -1 where
    not known), so that ``x[i]`` of a vector is an entry, of a matrix a row (of unknown axes: a view).
    Conservative: a position is left out only where no assignment, call or return reaches the array through that
    parameter or a name made from it.
    """
    namespace = func.__globals__ if namespace is None else namespace
    _seen = {} if _seen is None else _seen
    key = (func, tuple(ndims))
    if key in _seen:                          # recursion: every parameter written until shown otherwise
        return _seen[key] if _seen[key] is not None else frozenset(range(func.__code__.co_argcount))
    if namespace is func.__globals__ and key in _READ:
        return _READ[key]
    _seen[key] = None
    fdef, assigns, uses = _definition(func)
    params = [a.arg for a in fdef.args.posonlyargs + fdef.args.args]
    dims = {p: d for p, d in zip(params, ndims) if d >= 0}
    # names that may hold (a view of) a parameter's array: the parameter, and every name assigned from a value that
    # may be one (a loop's target over it too), to a fixed point
    aliases = {p: {p} for p in params}
    mixed = set()
    changed = True
    while changed:
        changed = False
        for targets, value in assigns:
            roots = _view_roots(value, namespace, dims, _seen)
            new = {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
            local = targets[0].id if len(targets) == 1 and isinstance(targets[0], ast.Name) else None
            if local is not None and local not in params and local not in mixed:
                axes = _ndim(value, dims)                   # a local row of a known matrix keeps its axes
                if axes is not None and dims.get(local, axes) == axes:
                    changed |= local not in dims
                    dims[local] = axes
                else:                                       # values of unknown or different axes: not known
                    mixed.add(local)
                    dims.pop(local, None)
                    changed = True
            for names in aliases.values():
                if roots & names and not new <= names:
                    names |= new
                    changed = True
    _seen[key] = frozenset(i for i, p in enumerate(params) if _writes(uses, aliases[p], namespace, dims, _seen))
    if namespace is func.__globals__ and None not in _seen.values():
        _READ[key] = _seen[key]             # read with no recursion left open: final
    return _seen[key]


#: :func:`written_arguments` of a kernel in its own module, by (function, axes): each read once per process.
_READ: dict = {}


@functools.lru_cache(maxsize=None)
def _definition(func):
    """The syntax tree of ``func``'s definition (its source read and parsed once per process), its assignments
    (``(targets, value)``, a loop's target and what it runs over too) and the nodes that may write, call or return
    (subscripts, augmented assignments, returns, calls)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    fdef = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef))
    assigns, uses = [], []
    for node in ast.walk(fdef):
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
            assigns.append((node.targets if isinstance(node, ast.Assign) else [node.target], node.value))
        elif isinstance(node, (ast.For, ast.comprehension)):
            assigns.append(([node.target], node.iter))
        if isinstance(node, (ast.Subscript, ast.AugAssign, ast.Return, ast.Call)):
            uses.append(node)
    return fdef, tuple(assigns), tuple(uses)


class _Dispatcher(_CPUDispatcher):
    """numba's CPU dispatcher, compiling one signature where the arguments differ only in read-only flags of arrays
    the kernel never writes and in the widths of signed integer scalars (the module's docstring says why)."""

    def _normal(self, args):
        ndims = tuple(t.ndim if isinstance(t, _types.Array) else 0 for t in args)
        written = written_arguments(self.py_func, ndims=ndims)  # read once per (kernel, axes): memoised there
        out = []
        for i, t in enumerate(args):
            if isinstance(t, (_types.IntegerLiteral, _types.BooleanLiteral)):
                t = _types.unliteral(t)                    # a constant argument of a compiled caller
            if isinstance(t, _types.Array) and t.mutable and i not in written:
                t = t.copy(readonly=True)
            elif isinstance(t, _types.Integer) and t.signed and t.bitwidth < 64:
                t = _types.int64
            out.append(t)
        return tuple(out)

    def compile(self, sig):
        args, return_type = _sigutils.normalize_signature(sig)
        args = tuple(args)
        try:
            normal = self._normal(args)
        except (OSError, SyntaxError, TypeError):          # pragma: no cover - no source to read (a frozen install)
            return super().compile(sig)
        if normal == args or return_type is not None or normal in getattr(self, "_refused", ()):
            return super().compile(sig)
        if args in self.overloads:
            return self.overloads[args].entry_point
        try:
            entry = super().compile(normal)
        except _errors.TypingError as _e:                  # pragma: no cover - a write the source reading missed
            self._refused = getattr(self, "_refused", set()) | {normal}
            REFUSED.append((self.py_func.__qualname__, normal, str(_e)[:3000]))
            return super().compile(sig)
        # the types as met call the one compilation (a writeable array is read by the read-only code as it is; an
        # int32 scalar is unboxed as an int64): no second compilation, no second entry in ``signatures``
        try:
            self._insert([a._code for a in args], entry, False)
        except (AttributeError, TypeError):                # pragma: no cover - a numba whose private table differs
            return super().compile(sig)
        return entry


def compile_in(namespace: dict, names, **options) -> bool:
    """Replace ``namespace[name]`` by ``numba.njit(cache=True, **options)`` of it for each name (one compilation
    for the argument types that differ only in read-only flags or integer widths: :class:`_Dispatcher`); return
    whether numba did it."""
    if _numba is None:  # pragma: no cover
        return False
    for name in names:  # pragma: no cover - with numba
        disp = _Dispatcher(py_func=namespace[name], locals={},
                           targetoptions={"nopython": True, "boundscheck": None, **options})
        disp.enable_caching()
        namespace[name] = disp
    return True
