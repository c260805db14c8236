"""TFF roles a method is composed of: composer, distributors, finalizers, the two-phase process, user groups."""
