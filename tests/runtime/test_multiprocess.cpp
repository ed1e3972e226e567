// Placeholder until the multi-process test lands.
int mkt_child_main(int, char**) { return 2; }
