/* main.c — sample_host entry point; everything else lives in libsample.a. */
#include "sh_run.h"

int main(int argc, char **argv) { return sh_run_main(argc, argv); }
