"""Models written with the public tppasm and loops APIs, as a user would (used by the model benches)."""
