"""A lane per model and class: its queue, its workers, and the inline and aside routes."""
