"""tff_fedrec: federated recommendation methods as TensorFlow Federated processes."""
