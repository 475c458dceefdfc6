"""Dtype casts a load makes, by dtype name (``"bfloat16"``, ``"int32"``): torch-free.

A loader copies a checkpoint tensor into its parameter with ``copy_``, which casts silently. Some
casts are routine (checkpoints saved in bf16 load into f32 parameters); some change what the
values mean (floats into integers, anything but bool into bool, complex into real).
"""

from __future__ import annotations


def kind(dtype: str) -> str:
    """``"bool"``, ``"complex"``, ``"float"`` or ``"int"``."""
    if dtype == "bool":
        return "bool"
    if dtype.startswith("complex"):
        return "complex"
    if dtype.startswith(("float", "bfloat")):
        return "float"
    return "int"


def is_incompatible(src: str, dst: str) -> bool:
    """Does a cast from ``src`` into a ``dst`` parameter change what the values mean?

    Float <-> float and integer -> float casts are allowed (and reported); a float or complex
    into integers, anything but bool into bool, and complex into real are not.

    Example:
        >>> is_incompatible("bfloat16", "float32"), is_incompatible("float32", "int64")
        (False, True)
    """
    if src == dst:
        return False
    s, d = kind(src), kind(dst)
    if d == "bool":
        return True
    if d == "int":
        return s in ("float", "complex")
    return s == "complex" and d != "complex"
