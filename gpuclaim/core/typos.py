"""Which known word a typo most likely meant (config keys: ``nodse`` is ``nodes``)."""

from __future__ import annotations

from typing import Optional


def closest(word: str, known: set[str]) -> Optional[str]:
    """The known key a typo most likely meant: fewest edits (a swap of two neighbours is one),
    then the closest length ('nodse' is 'nodes', not 'node'); at most 2 edits."""
    ranked = sorted(
        (_edits(word.lower(), candidate), abs(len(candidate) - len(word)), candidate)
        for candidate in known
    )
    if ranked and ranked[0][0] <= min(2, len(ranked[0][2]) // 2):
        return ranked[0][2]
    return None


def _edits(a: str, b: str) -> int:
    """Damerau-Levenshtein distance (optimal string alignment)."""
    d = [[i + j if i * j == 0 else 0 for j in range(len(b) + 1)] for i in range(len(a) + 1)]
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            cost = a[i - 1] != b[j - 1]
            d[i][j] = min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                d[i][j] = min(d[i][j], d[i - 2][j - 2] + 1)
    return d[len(a)][len(b)]
