"""The routes, one module per endpoint family; each validates its body, calls the backend and answers."""
