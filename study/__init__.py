"""Study orchestration: grids, Ray dispatch, resume, status, CLI."""
