"""The tests' shared kit: journal specs (`specs`), waiting for a condition with a deadline
(`eventually`), a child process's state (`processes`)."""
