"""The tests' shared kit: journal specs (`specs`)."""
