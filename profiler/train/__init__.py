"""`devprof run`'s training run: its options checked into one `RunConfig` (`config`), the run
(`run`: the CNN or a user's model trained by models/' loop, recorded by a session), its hooks
into that loop (`hooks`) and oneDNN's kernel lines (`onednn_verbose`)."""
