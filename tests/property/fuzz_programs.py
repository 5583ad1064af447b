"""Random small JAX programs for the fuzzer (tests/property/test_fuzz.py).

A :class:`Program` is plain data (readable when hypothesis prints a failing example): a start
shape, a dtype, a chain of :class:`Step` s applied to one running value ``v`` (2-D) and whether the
program is differentiated. :func:`build` turns it into ``(fn, args)``: ``fn(*args)`` runs the chain
on ``args[0]``; steps that need more inputs (weights, indices, runtime starts, a typed PRNG key,
a branch predicate) read them from ``args`` at the positions ``build`` gave them. :func:`programs`
is the hypothesis strategy.

Each op is one entry of ``OPS``: ``params(draw, shape, dtype) -> tuple | None`` (None: does not
apply to this shape/dtype) and ``apply(shape, params, dtype, rng) -> (op, new_inputs, shape)``,
``op(v, extra) -> v`` where ``extra`` are the op's own inputs.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import strategies as st
from jax import lax

MESHES = ((1, 8), (2, 4), (4, 2), (2, 2, 2))
SIZES = (0, 1, 2, 3, 4, 6, 8, 8, 12, 16, 16)  # 8 and 16 twice: more splittable dims


@dataclasses.dataclass(frozen=True)
class Step:
    op: str
    params: tuple


@dataclasses.dataclass(frozen=True)
class Program:
    shape: tuple
    dtype: str           # "float32" or "int32"
    steps: tuple
    grad: bool           # value_and_grad of sum(tanh(out)) w.r.t. args[0] (float32 only)
    two_outputs: bool    # also return the value after the first step (without grad)
    mesh: tuple
    seed: int


def _size(draw, at_most=16):
    return draw(st.sampled_from([s for s in SIZES if s <= at_most]))


def _start(draw, dim, size):
    """A runtime start, out of range (jax clamps it) about half the time."""
    return draw(st.integers(min_value=-3, max_value=dim - size + 3))


def _rand(rng, shape, dtype, scale=1.0):
    if dtype == "int32":
        return rng.randint(-3, 4, size=shape).astype(np.int32)
    return (rng.standard_normal(shape) * scale).astype(np.float32)


# ---- ops: params and apply ------------------------------------------------------------------

_UNARY = (jnp.sin, jnp.tanh, jnp.abs, lambda v: jnp.exp(-v * v))


def _unary(shape, p, dtype, rng):
    return (lambda v, e: _UNARY[p[0]](v)), [], shape


_BINARY = (jnp.add, jnp.multiply, jnp.maximum, jnp.subtract)


def _binary(shape, p, dtype, rng):
    return (lambda v, e: _BINARY[p[0]](v, e[0])), [_rand(rng, shape, dtype)], shape


def _dot(shape, p, dtype, rng):
    (k, transposed) = p
    m, n = shape
    w = _rand(rng, (k, n) if transposed else (n, k), dtype, 1.0 / max(1, n) ** 0.5)
    spec = "mn,kn->mk" if transposed else "mn,nk->mk"
    return (lambda v, e: jnp.einsum(spec, v, e[0])), [w], (m, k)


def _residual(shape, p, dtype, rng):
    """v + f(v @ w): two consumers of v (w square, so the shape stays)."""
    n = shape[1]
    w = _rand(rng, (n, n), dtype, 1.0 / max(1, n) ** 0.5)
    act = jnp.tanh if dtype == "float32" else (lambda a: a)
    return (lambda v, e: v + act(v @ e[0])), [w], shape


def _reduce(shape, p, dtype, rng):
    axis, kind = p
    m, n = shape
    out = (1, n) if axis == 0 else (m, 1)
    if kind == 0:
        return (lambda v, e: jnp.sum(v, axis=axis, keepdims=True)), [], out
    return (lambda v, e: jnp.max(v, axis=axis, keepdims=True, initial=-3)), [], out


def _slice(shape, p, dtype, rng):
    a, b = p
    return (lambda v, e: v[a:b]), [], (b - a, shape[1])


def _dynamic_slice(shape, p, dtype, rng):
    axis, size, start = p
    sizes = (size, shape[1]) if axis == 0 else (shape[0], size)
    starts = lambda i: (i, 0) if axis == 0 else (0, i)  # noqa: E731
    return (lambda v, e: lax.dynamic_slice(v, starts(e[0]), sizes)), [np.int32(start)], sizes


def _dynamic_update_slice(shape, p, dtype, rng):
    axis, size, start = p
    sizes = (size, shape[1]) if axis == 0 else (shape[0], size)
    starts = lambda i: (i, 0) if axis == 0 else (0, i)  # noqa: E731
    return (lambda v, e: lax.dynamic_update_slice(v, e[0], starts(e[1]))), \
        [_rand(rng, sizes, dtype), np.int32(start)], shape


def _gather(shape, p, dtype, rng):
    (k,) = p
    idx = rng.randint(-shape[0], shape[0], size=(k,)).astype(np.int32)  # negative: from the end
    return (lambda v, e: v[e[0]]), [idx], (k, shape[1])


def _scatter(shape, p, dtype, rng):
    (k,) = p
    idx = rng.randint(0, shape[0], size=(k,)).astype(np.int32)
    return (lambda v, e: v.at[e[0]].add(e[1])), [idx, _rand(rng, (k, shape[1]), dtype)], shape


def _sort(shape, p, dtype, rng):
    return (lambda v, e: jnp.sort(v, axis=p[0])), [], shape


def _top_k(shape, p, dtype, rng):
    return (lambda v, e: lax.top_k(v, p[0])[0]), [], (shape[0], p[0])


def _conv(shape, p, dtype, rng):
    width, channels = p
    kernel = _rand(rng, (width, 1, channels), dtype, 0.5)

    def op(v, e):
        out = lax.conv_general_dilated(v[:, :, None], e[0], (1,), "SAME",
                                       dimension_numbers=("NWC", "WIO", "NWC"))
        return jnp.sum(out, axis=-1)

    return op, [kernel], shape


def _cond(shape, p, dtype, rng):
    pred = np.float32(rng.standard_normal())  # an input: rounding never picks the branch
    return (lambda v, e: lax.cond(e[0] > 0, lambda a: a * 2 + 1, lambda a: a - 3, v)), [pred], shape


# Float ops keep values moderate: a large intermediate (a running product) squashed by a later
# sin or tanh would differ from jax.jit by its own rounding (a false alarm, found at |v| ~ 9e3).
def _loop(shape, p, dtype, rng):
    body = (lambda a: a * 2 - 1) if dtype == "int32" else (lambda a: a * 0.5 + 1)
    if p[0] == 0:  # a while_loop (jax cannot reverse-differentiate it)
        return (lambda v, e: lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, body(c[1])),
                                            (0, v))[1]), [], shape
    return (lambda v, e: lax.fori_loop(0, 3, lambda i, a: body(a) - i, v)), [], shape


def _scan(shape, p, dtype, rng):
    """A recurrence over the rows: c <- c + row (int32) or tanh(c + row) (float32), ys = c * row."""
    squash = (lambda a: a) if dtype == "int32" else jnp.tanh

    def op(v, e):
        def row_step(c, row):
            c = squash(c + row)
            return c, c * row

        return lax.scan(row_step, jnp.zeros(v.shape[1:], v.dtype), v)[1]

    return op, [], shape


def _transpose(shape, p, dtype, rng):
    return (lambda v, e: v.T), [], shape[::-1]


def _reshape(shape, p, dtype, rng):
    return (lambda v, e: v.reshape(shape[::-1])), [], shape[::-1]


def _random(shape, p, dtype, rng):
    key = jax.random.key(int(rng.randint(0, 2**31 - 1)))
    return (lambda v, e: v + 0.1 * jax.random.normal(e[0], v.shape, v.dtype)), [key], shape


def _concat(shape, p, dtype, rng):
    axis, size = p
    other = (size, shape[1]) if axis == 0 else (shape[0], size)
    out = (shape[0] + size, shape[1]) if axis == 0 else (shape[0], shape[1] + size)
    return (lambda v, e: jnp.concatenate([v, e[0]], axis=axis)), [_rand(rng, other, dtype)], out


def _pad(shape, p, dtype, rng):
    lo, hi = p
    return (lambda v, e: jnp.pad(v, ((lo, hi), (0, 0)))), [], (shape[0] + lo + hi, shape[1])


def _cumsum(shape, p, dtype, rng):
    return (lambda v, e: jnp.cumsum(v, axis=p[0])), [], shape


def _fft(shape, p, dtype, rng):
    return (lambda v, e: jnp.abs(jnp.fft.fft(v, axis=1)).astype(v.dtype)), [], shape


def _bmm(shape, p, dtype, rng):
    (k,) = p
    m, n = shape
    w = _rand(rng, (m, n, k), dtype, 1.0 / max(1, n) ** 0.5)
    return (lambda v, e: jnp.einsum("mn,mnk->mk", v, e[0])), [w], (m, k)


def _bias(shape, p, dtype, rng):
    """A 1-D input broadcast along rows (p[0] == 0) or columns."""
    axis = p[0]
    b = _rand(rng, (shape[1 - axis],), dtype)
    return (lambda v, e: v + (e[0][None, :] if axis == 0 else e[0][:, None])), [b], shape


def _center(shape, p, dtype, rng):
    return (lambda v, e: v - jnp.sum(v, axis=p[0], keepdims=True) // 2 if dtype == "int32"
            else v - jnp.mean(v, axis=p[0], keepdims=True)), [], shape


def _softmax(shape, p, dtype, rng):
    return (lambda v, e: jax.nn.softmax(v, axis=p[0])), [], shape


def _take_along(shape, p, dtype, rng):
    (k,) = p
    idx = rng.randint(0, shape[1], size=(shape[0], k)).astype(np.int32)
    return (lambda v, e: jnp.take_along_axis(v, e[0], axis=1)), [idx], (shape[0], k)


def _scatter_set(shape, p, dtype, rng):
    (k,) = p
    idx = rng.permutation(shape[0])[:k].astype(np.int32)  # distinct: .set of duplicates is unordered
    return (lambda v, e: v.at[e[0]].set(e[1])), [idx, _rand(rng, (len(idx), shape[1]), dtype)], shape


def _index_row(shape, p, dtype, rng):
    """v[i] with a runtime i (a dynamic_slice of one row), kept 2-D."""
    return (lambda v, e: v[e[0]][None, :]), [np.int32(p[0])], (1, shape[1])


def _update_row(shape, p, dtype, rng):
    return (lambda v, e: v.at[e[0]].set(e[1])), [np.int32(p[0]), _rand(rng, (shape[1],), dtype)], shape


def _flip(shape, p, dtype, rng):
    return (lambda v, e: jnp.flip(v, axis=p[0])), [], shape


def _roll(shape, p, dtype, rng):
    axis, shift = p
    return (lambda v, e: jnp.roll(v, shift, axis=axis)), [], shape


def _where(shape, p, dtype, rng):
    mask = rng.standard_normal(shape) > 0  # an input: rounding never flips it
    return (lambda v, e: jnp.where(e[0], v, e[1])), [mask, _rand(rng, shape, dtype)], shape


# ---- which params each op takes for a shape (None: not here) -----------------------------------

def _p_dynamic(draw, shape, dt):
    axis = draw(st.integers(0, 1))
    size = draw(st.integers(0, shape[axis]))
    return axis, size, _start(draw, shape[axis], size)


def _p_slice(draw, shape, dt):
    a = draw(st.integers(0, shape[0]))
    return a, draw(st.integers(a, shape[0]))


FLOAT_ONLY = {"unary", "conv", "random", "fft", "softmax"}
OPS = {
    "unary": (lambda d, s, dt: (d(st.integers(0, len(_UNARY) - 1)),), _unary),
    "binary": (lambda d, s, dt: (d(st.integers(0, len(_BINARY) - 1)),), _binary),
    "dot": (lambda d, s, dt: (_size(d, 8), d(st.booleans())), _dot),
    "residual": (lambda d, s, dt: (), _residual),
    "reduce": (lambda d, s, dt: (d(st.integers(0, 1)), d(st.integers(0, 1))), _reduce),
    "slice": (_p_slice, _slice),
    "dynamic_slice": (_p_dynamic, _dynamic_slice),
    "dynamic_update_slice": (_p_dynamic, _dynamic_update_slice),
    "gather": (lambda d, s, dt: (_size(d, 12),) if s[0] else None, _gather),
    "scatter": (lambda d, s, dt: (_size(d, 12),) if s[0] else None, _scatter),
    "sort": (lambda d, s, dt: (d(st.integers(0, 1)),), _sort),
    "top_k": (lambda d, s, dt: (d(st.integers(0, s[1])),), _top_k),
    "conv": (lambda d, s, dt: (d(st.sampled_from((1, 2, 3))), d(st.sampled_from((1, 2, 4)))), _conv),
    "cond": (lambda d, s, dt: (), _cond),
    "loop": (lambda d, s, dt: (d(st.integers(0, 1)),), _loop),
    "scan": (lambda d, s, dt: (), _scan),
    "transpose": (lambda d, s, dt: (), _transpose),
    "reshape": (lambda d, s, dt: (), _reshape),
    "random": (lambda d, s, dt: (), _random),
    "concat": (lambda d, s, dt: (d(st.integers(0, 1)), _size(d, 8)), _concat),
    "pad": (lambda d, s, dt: (d(st.integers(0, 3)), d(st.integers(0, 3))), _pad),
    "cumsum": (lambda d, s, dt: (d(st.integers(0, 1)),), _cumsum),
    "fft": (lambda d, s, dt: (), _fft),
    "bmm": (lambda d, s, dt: (_size(d, 8),), _bmm),
    "bias": (lambda d, s, dt: (d(st.integers(0, 1)),), _bias),
    "center": (lambda d, s, dt: (d(st.integers(0, 1)),), _center),
    "softmax": (lambda d, s, dt: (d(st.integers(0, 1)),), _softmax),
    "take_along": (lambda d, s, dt: (_size(d, 8),) if s[1] else None, _take_along),
    "scatter_set": (lambda d, s, dt: (d(st.integers(0, s[0])),), _scatter_set),
    "index_row": (lambda d, s, dt: (_start(d, s[0], 1),) if s[0] else None, _index_row),
    "update_row": (lambda d, s, dt: (_start(d, s[0], 1),) if s[0] else None, _update_row),
    "flip": (lambda d, s, dt: (d(st.integers(0, 1)),), _flip),
    "roll": (lambda d, s, dt: (d(st.integers(0, 1)), d(st.integers(-3, 3))), _roll),
    "where": (lambda d, s, dt: (), _where),
}


def _bounded(shape) -> bool:
    return shape[0] <= 48 and shape[1] <= 48


@st.composite
def programs(draw, max_steps: int = 6):
    """A random :class:`Program` (1 to ``max_steps`` steps, 2-D values of at most 48 x 48)."""
    dtype = draw(st.sampled_from(("float32", "float32", "int32")))
    shape = (_size(draw), _size(draw))
    names = [n for n in OPS if dtype == "float32" or n not in FLOAT_ONLY]
    steps, cur = [], shape
    for _ in range(draw(st.integers(1, max_steps))):
        name = draw(st.sampled_from(names))
        params = OPS[name][0](draw, cur, dtype)
        if params is None:
            continue
        _, _, nxt = OPS[name][1](cur, params, dtype, np.random.RandomState(0))
        if not _bounded(nxt):
            continue
        steps.append(Step(name, tuple(params)))
        cur = nxt
    grad = dtype == "float32" and draw(st.booleans())
    return Program(shape, dtype, tuple(steps), grad, not grad and draw(st.booleans()),
                   draw(st.sampled_from(MESHES)), draw(st.integers(0, 2**16)))


def build(prog: Program):
    """``(fn, args)`` of a Program: ``fn(*args)`` is the program's output (a value; with
    ``prog.two_outputs`` also the first step's; with ``prog.grad`` the pair (loss,
    d loss / d args[0]))."""
    rng = np.random.RandomState(prog.seed)
    args = [_rand(rng, prog.shape, prog.dtype)]
    ops, shape = [], prog.shape
    for step in prog.steps:
        op, extra, shape = OPS[step.op][1](shape, step.params, prog.dtype, rng)
        ops.append((op, len(args), len(extra)))
        args += extra

    def fn(*a):
        v, first = a[0], None
        for op, at, n in ops:
            v = op(v, a[at:at + n])
            first = v if first is None else first
        return (v, first) if prog.two_outputs and first is not None else v

    if not prog.grad:
        return fn, args
    return jax.value_and_grad(lambda *a: jnp.sum(jnp.tanh(fn(*a)))), args
