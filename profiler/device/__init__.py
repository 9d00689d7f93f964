"""What a run trains on: its devices and their `tf.distribute` strategy (`devices`), its place in a
job of several workers (`cluster`), and TensorFlow imported with its log noise held back (`quiet`)."""
