"""Hypothesis draws shared by the loop-spec strategies of the nest tests and the race oracle."""
from hypothesis import strategies as st


def collapse_run(draw, seq):
    """(first, last) positions of a collapsed parallel run over the spec's letters ``seq``: consecutive
    levels, no loop twice."""
    i = draw(st.integers(0, len(seq) - 1))
    j = i
    while j + 1 < len(seq) and seq[j + 1] not in seq[i:j + 1] and draw(st.booleans()):
        j += 1
    return i, j


def grid_axes(draw, seq, budget):
    """{position: (axis, teams)}: one to three levels of ``seq`` on the R, C, L axes of a thread grid
    of at most ``budget`` threads."""
    chosen = draw(st.lists(st.integers(0, len(seq) - 1), min_size=1, max_size=3, unique=True))
    axes = {}
    for pos, axis in zip(chosen, draw(st.permutations("RCL"))):
        teams = draw(st.integers(1, max(1, budget)))
        budget //= teams
        axes[pos] = (axis, teams)
    return axes
