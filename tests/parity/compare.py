"""The parity criterion, in one place so the checker itself can be tested.

  1. NaN positions must match exactly, and so must ±Inf positions.
  2. Over the entries finite in both, ‖ours − ref‖₂ / ‖ref‖₂ < tol
     (an all-zero reference demands an all-zero result).
"""
import numpy as np


def _first(mask):
    idx = np.argwhere(mask)
    return tuple(int(i) for i in idx[0]) if len(idx) else None


def compare(ours, ref, tol):
    """Returns (ok, relative error, one-line detail)."""
    ours = np.asarray(ours, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if ours.shape != ref.shape:
        return False, float("inf"), f"shape {ours.shape}, expected {ref.shape}"
    nan_diff = np.isnan(ours) != np.isnan(ref)
    if nan_diff.any():
        i = _first(nan_diff)
        return (False, float("inf"),
                f"NaN positions differ at {int(nan_diff.sum())} entries, first {i}: "
                f"ours {ours[i]!r}, ref {ref[i]!r}")
    inf_diff = (np.isposinf(ours) != np.isposinf(ref)) | (np.isneginf(ours) != np.isneginf(ref))
    if inf_diff.any():
        i = _first(inf_diff)
        return (False, float("inf"),
                f"Inf positions differ at {int(inf_diff.sum())} entries, first {i}: "
                f"ours {ours[i]!r}, ref {ref[i]!r}")
    finite = np.isfinite(ref)
    diff = np.where(finite, ours - ref, 0.0)
    num = float(np.linalg.norm(diff))
    den = float(np.linalg.norm(np.where(finite, ref, 0.0)))
    rel = num / den if den > 0 else (0.0 if num == 0 else float("inf"))
    if rel < tol:
        return True, rel, f"rel {rel:.3e} < {tol:.0e}"
    i = tuple(int(k) for k in np.unravel_index(int(np.argmax(np.abs(diff))), diff.shape)) if diff.size else ()
    return (False, rel,
            f"rel {rel:.3e} >= {tol:.0e}; largest difference at {i}: ours {ours[i]!r}, ref {ref[i]!r}")


def self_test(tol, rng):
    """The checker must catch one perturbed element and one misplaced NaN."""
    problems = []
    ref = rng.standard_normal((3, 4, 5))
    if not compare(ref.copy(), ref, tol)[0]:
        problems.append("identical arrays rejected")
    bumped = ref.copy()
    bumped[1, 2, 3] += 10 * tol * np.linalg.norm(ref)
    if compare(bumped, ref, tol)[0]:
        problems.append("one element perturbed by 10·tol·‖ref‖ accepted")
    nan_ref = ref.copy()
    nan_ref[0, 0, :] = np.nan
    if compare(ref, nan_ref, tol)[0]:
        problems.append("missing NaN row accepted")
    moved = nan_ref.copy()
    moved[0, 0, :] = ref[0, 0, :]
    moved[0, 1, :] = np.nan
    if compare(moved, nan_ref, tol)[0]:
        problems.append("NaN row in the wrong place accepted")
    if compare(ref[:2], ref, tol)[0]:
        problems.append("wrong shape accepted")
    return problems
