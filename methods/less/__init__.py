"""LESS (Dong et al., ICML 2024): the method (``method``), its learned kernels (``kernels``), kernel-set
checkpoints (``checkpoints``), the training student (``student``) and the teacher activations
(``activations``) that the training runner (``runners.train_less``, ``runner=train_less``) uses."""

from methods.less.method import LESS

__all__ = ["LESS"]
