"""Small shims so megatron-core 0.19 imports on Python 3.11 (CPU machines and CI).

megatron-core 0.17+ declares Python >= 3.12; its code imports on 3.11 except for two modules
that use `typing.override` (new in 3.12). typing_extensions provides the same decorator.
"""
import typing


def ensure_typing_override() -> None:
    if not hasattr(typing, "override"):
        import typing_extensions

        typing.override = typing_extensions.override
