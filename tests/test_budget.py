import pytest

from runners.setup.budget import resolve_budget, validate_budget


@pytest.mark.parametrize(
    ("budget", "prompt", "slots"),
    [(0.05, 400, 20), (0.2, 275, 55), (1.0, 275, 275), (0.001, 100, 1), (512, 3000, 512), (512.0, 10, 512)],
)
def test_fractions_of_the_prompt_and_absolute_counts(budget, prompt, slots):
    assert resolve_budget(budget, prompt) == slots


def test_none_means_no_compression():
    assert resolve_budget(None, 100) is None


@pytest.mark.parametrize("budget", [0, -1, 0.0, -0.5, 1.5, float("nan"), "abc", True])
def test_bad_budgets_raise(budget):
    with pytest.raises(ValueError):
        validate_budget(budget)


def test_context_unit_is_a_fraction_of_the_context_window():
    assert resolve_budget(0.05, 300, 8192, "context") == 409  # ZSMerge/LESS XSum convention
    assert resolve_budget(0.05, 300, 4096, "context") == 204  # Llama-2 5% in docs/methods.md
    assert resolve_budget(512, 300, 8192, "context") == 512


def test_bad_units_raise():
    with pytest.raises(ValueError, match="budget_unit"):
        resolve_budget(0.1, 100, 4096, "tokens")
    with pytest.raises(ValueError, match="context size"):
        resolve_budget(0.1, 100, None, "context")
