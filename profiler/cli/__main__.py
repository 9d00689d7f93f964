from profiler.cli import program

program()
