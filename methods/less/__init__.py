"""LESS (Dong et al., ICML 2024): the method (``method``), its learned kernels (``kernels``), kernel-set
checkpoints (``checkpoints``), the training student (``student``) and the training runner
(``train``, ``runner=train_less``, fed by the teacher activations of ``activations``)."""

from methods.less.method import LESS

__all__ = ["LESS"]
