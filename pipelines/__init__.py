"""Stage logic over Arrow tables and numpy. Nothing here imports Ray."""

from logicrank.pipelines.moved import install as _serve_moved_paths

_serve_moved_paths()  # the module paths that moved in issue 52, for one release (pipelines/moved.py)
