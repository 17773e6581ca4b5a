"""``gpuclaim board``: a live terminal board of who holds which GPU.

A thin face over the core, like the CLI. Importing this package costs nothing: textual is
imported only by ``gpuclaim.board.app`` and the widget modules, so ``board --once`` and
``gpuclaim --help`` never pay for it.
"""
