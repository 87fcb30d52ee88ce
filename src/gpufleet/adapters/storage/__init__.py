"""State stores: in memory (simulator, tests) and SQL (SQLite, PostgreSQL)."""
