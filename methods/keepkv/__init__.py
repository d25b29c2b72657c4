"""KeepKV (Tian et al.): the method (``method``), its score estimators (``estimators``) and
ZIP-merging (``zip_merge``)."""

from methods.keepkv.method import KeepKV

__all__ = ["KeepKV"]
