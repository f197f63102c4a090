"""roll-cluster: configuration, catalogs and node scripts behind the Pulumi components."""
