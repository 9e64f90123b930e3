"""Readable torch implementations of every public op: the specification the kernels meet."""

__all__: list[str] = []
