#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <fcntl.h>
#include <unistd.h>
#include <signal.h>
#include <sys/wait.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <string.h>
#include <stdlib.h>
#include <errno.h>
static volatile int got;
static void h(int s){ struct stat st; got = stat("/etc/hostname", &st) == 0 ? 1 : -1; }
static void *t(void *a){ int ok=0; for(int i=0;i<200;i++){ int fd=open("/etc/hostname",O_RDONLY); if(fd>=0){ok++;close(fd);} } return (void*)(long)ok; }
int main(){
  pthread_t th[8]; long total=0;
  for(int i=0;i<8;i++) pthread_create(&th[i],0,t,0);
  for(int i=0;i<8;i++){ void*r; pthread_join(th[i],&r); total+=(long)r; }
  printf("threads opened %ld\n", total);
  struct sigaction sa; memset(&sa,0,sizeof sa); sa.sa_handler=h; sigfillset(&sa.sa_mask); sigaction(SIGUSR1,&sa,0);
  sigset_t all; sigfillset(&all); sigprocmask(SIG_BLOCK,&all,0); sigprocmask(SIG_UNBLOCK,&all,0);
  raise(SIGUSR1); printf("handler stat %d\n", got);
  pid_t p = vfork(); if(p==0){ execl("/bin/echo","echo","vforked",NULL); _exit(9);} int st; waitpid(p,&st,0); printf("vfork child %d\n", WEXITSTATUS(st));
  p = fork(); if(p==0){ int fd=open("/etc/hostname",O_RDONLY); _exit(fd>=0?5:6);} waitpid(p,&st,0); printf("fork child %d\n", WEXITSTATUS(st));
  struct statx sx; printf("statx %d\n", statx(AT_FDCWD,"/etc/hostname",0,STATX_SIZE,&sx)==0 ? (int)sx.stx_size : -1);
  printf("faccessat2 %ld\n", syscall(439, AT_FDCWD, "/etc/hostname", R_OK, AT_EACCESS));
  printf("fchmodat2 nofollow on symlink %ld\n", (symlink("/etc/hostname","/tmp/ictus-l"), syscall(452, AT_FDCWD, "/tmp/ictus-l", 0644, AT_SYMLINK_NOFOLLOW)));
  unlink("/tmp/ictus-l");
  struct { unsigned long long flags, mode, resolve; } how = { O_RDONLY, 0, 0x08 };
  printf("openat2 beneath abs %ld\n", syscall(437, AT_FDCWD, "/etc/hostname", &how, sizeof how));
  int d = open("/etc", O_PATH|O_DIRECTORY);
  printf("openat2 beneath rel %ld\n", syscall(437, d, "hostname", &how, sizeof how) >= 0);
  printf("openat2 beneath dotdot %ld\n", syscall(437, d, "../etc/hostname", &how, sizeof how));
  errno = 0; int bad = open((char *)1, O_RDONLY);
  printf("open of a bad pointer %d %s\n", bad, strerror(errno));
  errno = 0; int badst = stat("/etc", (struct stat *)1);
  printf("stat into a bad pointer %d %s\n", badst, strerror(errno));
  return 0;
}
