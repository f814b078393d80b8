/* The session's first program whose first served call is its vfork child's exec:
 * it has no connection of its own yet, and the child's must not stay in the table
 * the two share (the descriptor was the child's alone). Three times, so a second
 * child would borrow what a first left. Usage: vfirst PROGRAM (e.g. /bin/true).
 * Prints each child's exit status. */
#define _GNU_SOURCE
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 2)
        return 2;
    char *args[] = {argv[1], NULL};
    char line[64];
    int n = 0;
    for (int i = 0; i < 3; i++) {
        pid_t c = vfork();
        if (c == 0) {
            execv(argv[1], args);
            _exit(126);
        }
        int st = 0;
        if (c < 0 || waitpid(c, &st, 0) != c)
            return 3;
        n += snprintf(line + n, sizeof line - n, "%d ", WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
    }
    printf("exits %s\n", line);
    return 0;
}
