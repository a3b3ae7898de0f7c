"""`python -m batchgen ...`: the command line, as the `batchgen` script runs it."""

if __name__ == "__main__":  # vLLM starts its workers with spawn, which imports this module again
    from batchgen.cli import main

    main()
