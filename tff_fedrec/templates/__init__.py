"""The generic roles a process is composed of (`roles`), the composer, the
two-phase process, the broadcast, the generic finalizers and the users'
groups per TFF client; no paper's role and no item table."""
