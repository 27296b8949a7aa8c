/* nosym.c — test plugin: a valid shared object that exports no protrain table. */
int pt_test_nosym_answer(void);
int pt_test_nosym_answer(void) { return 42; }
