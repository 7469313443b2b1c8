"""Loop DSL: spec grammar, nest code generation, the native thread pool (loops.pool)."""
