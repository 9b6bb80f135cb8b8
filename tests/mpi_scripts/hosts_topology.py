"""hosts_topology.py - run under mpirun across vcluster hosts: prints one line
per rank, 'HOST rank size local_rank local_size cross_rank cross_size hostname',
with hpcdl's topology taken from MPI's own node split (no HPCDL_LOCAL_SIZE),
then checks with an all-gather of host names that the ranks sharing a
local_size group are exactly the ranks on one host. Prints 'TOPOLOGY OK' on
rank 0 and exits non-zero otherwise."""
import socket
import sys

from hpcdl import comm

c = comm.init()
name = socket.gethostname()
sys.stdout.write("HOST %d %d %d %d %d %d %s\n" % (c.rank, c.size, comm.local_rank(),
                                                   comm.local_size(), comm.cross_rank(),
                                                   comm.cross_size(), name))
names = c.mpi.allgather(name)
cross = c.mpi.allgather(comm.cross_rank())
same_host = [r for r in range(c.size) if names[r] == name]
same_group = [r for r in range(c.size) if cross[r] == comm.cross_rank()]
ok = same_host == same_group and comm.local_size() == len(same_host) \
    and comm.cross_size() == len(set(names))
ok = c.mpi.allreduce(int(ok)) == c.size
if c.rank == 0:
    print("TOPOLOGY OK" if ok else "TOPOLOGY WRONG %s" % names, flush=True)
sys.exit(0 if ok else 1)
