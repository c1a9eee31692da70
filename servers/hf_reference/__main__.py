"""`python -m servers.hf_reference MODEL_DIR --port N [--no-token-ids] [--no-logprobs]`."""

from servers.hf_reference.launch import main

main()
