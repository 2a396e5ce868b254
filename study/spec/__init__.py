"""The grid as a specification: its sections and their validation, safe YAML reading, command-line overrides, the search section, and what a grid costs (`study plan`)."""
