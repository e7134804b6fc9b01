"""`python -m llmrt ...` runs the command line (llmrt/cli.py), as the `llmrt` script does."""
from llmrt.cli import main

if __name__ == "__main__":
    main()
