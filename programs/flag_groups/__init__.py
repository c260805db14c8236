"""The training program's flags, one module per group of flags.

Every flag belongs to one group (`group.FlagGroup`). The groups `data`,
`run` and `execution` apply to every run; a method's registry entry names
the others it takes (`registry.MethodEntry.flag_groups`), and its protocol
adds its own (`leave_one_out` or `random_split`). A flag of a group the
chosen method does not take is refused, not ignored (`group.refuse_unused`).
`ALL` maps each group's name to it.
"""
