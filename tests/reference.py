"""Independent reference implementations of every layer's formula, written loop-by-slot
from the notation of the book (slow but obviously correct). Used only by the tests."""


def key_value(x, K, V, act):
    return sum(act(x @ K[j])[..., None] * V[j] for j in range(K.shape[0]))


def static_query(x, Q, K, V, act):
    return sum(act((x @ Q) @ K[j])[..., None] * V[j] for j in range(K.shape[0]))


def bilinear(x, A, V, act):
    return sum(act(((x @ A[j]) * x).sum(-1))[..., None] * V[j] for j in range(A.shape[0]))


def symmetric(x, Q, K, V, act):
    m, r, _ = Q.shape
    out = 0
    for j in range(m):
        s = sum((x @ Q[j, s_]) * (x @ K[j, s_]) for s_ in range(r))
        out = out + act(s)[..., None] * V[j]
    return out


def gated(x, Q, K, V, act):
    m, r, _ = Q.shape
    out = 0
    for j in range(m):
        h = sum(act(x @ Q[j, s_]) * (x @ K[j, s_]) for s_ in range(r))
        out = out + h[..., None] * V[j]
    return out


def symmetrized(x, Q, K, V, act):
    m, r, _ = Q.shape
    out = 0
    for j in range(m):
        h = sum(0.5 * (act(x @ Q[j, s_]) * (x @ K[j, s_]) + act(x @ K[j, s_]) * (x @ Q[j, s_]))
                for s_ in range(r))
        out = out + h[..., None] * V[j]
    return out


def layer_formula(layer, x):
    """The formula of ``layer`` (any qkmlp layer) applied to ``x``, read off its weights."""
    from qkmlp import (BilinearAttentionMLP, GatedMLP, KeyValueMLP, StaticQueryMLP, SymmetricBilinearMLP,
                       SymmetrizedGatedMLP)

    act = layer.activation
    if isinstance(layer, KeyValueMLP):
        return key_value(x, layer.key, layer.value, act)
    if isinstance(layer, StaticQueryMLP):
        return static_query(x, layer.query, layer.key, layer.value, act)
    if isinstance(layer, BilinearAttentionMLP):
        return bilinear(x, layer.interaction, layer.value, act)
    if isinstance(layer, SymmetricBilinearMLP):
        return symmetric(x, layer.query, layer.key, layer.value, act)
    if isinstance(layer, SymmetrizedGatedMLP):
        return symmetrized(x, layer.query, layer.key, layer.value, act)
    if isinstance(layer, GatedMLP):
        return gated(x, layer.query, layer.key, layer.value, act)
    raise TypeError(f"layer_formula: expected a qkmlp layer, got {type(layer).__name__}")
