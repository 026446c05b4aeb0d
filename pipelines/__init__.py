"""Stage logic over Arrow tables and numpy. Nothing here imports Ray."""
