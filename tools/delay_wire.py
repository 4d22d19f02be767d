"""Two hosts joined by a wire with a delay, for the forecast's latency term (`tools/bench_forecast.py --delay`).

The development machines' kernel has no `netem` queueing discipline (nor `fq`, whose departure times a BPF program could set), so
`tc` cannot delay packets. Here each host gets a TAP device instead of its end of a veth pair, and one process carries every
Ethernet frame from one TAP to the other `delay` later, both ways, in order: a wire of that length. It is a Python process on the
same cores as the ranks, so it also limits the rate (measure it: `fastddp-doctor --bench` across the hosts) and costs CPU.
`WireHosts` is `tests/hosts.py`'s `Hosts` with that wire as its `join`: `launch` and `shape` (a token bucket on each TAP) work as there.
Usage as a wire alone (root): python tools/delay_wire.py TAP1 TAP2 DELAY_MS"""
import os, sys, time, errno, heapq, fcntl, struct, select, subprocess
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]/'tests'))
from hosts import Hosts # test code, kept with the tests

TUNSETIFF,IFF_TAP,IFF_NO_PI = 0x400454ca,0x0002,0x1000

def tap(name:str):
    "A file descriptor for a new TAP device `name` (Ethernet frames, no packet information header), non-blocking"
    fd = os.open('/dev/net/tun', os.O_RDWR|os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack('16sH', name.encode(), IFF_TAP|IFF_NO_PI))
    return fd

def wire(a:int, b:int, delay:float):
    "Carry each frame read from `a` to `b` and from `b` to `a`, `delay` seconds after it was read, in order; runs until killed"
    q,n,peer = [],0,{a:b, b:a}
    while True:
        r,_,_ = select.select([a, b], [], [], max(0., q[0][0]-time.monotonic()) if q else None)
        now = time.monotonic()
        for fd in r:
            while True: # every frame waiting, not one a wake-up
                try: f = os.read(fd, 65536)
                except BlockingIOError: break
                heapq.heappush(q, (now+delay, n, peer[fd], f)); n += 1
        now = time.monotonic()
        while q and q[0][0]<=now:
            _,_,o,f = heapq.heappop(q)
            try: os.write(o, f)
            except BlockingIOError: pass # the device's queue is full: the frame is lost, as on a wire; TCP sends it again
            except OSError as e: # EIO: the other end is not up yet, as a cable into a switched-off port
                if e.errno!=errno.EIO: raise

class WireHosts(Hosts):
    "`Hosts` joined by a wire `delay_ms` long (a process carrying frames between two TAP devices) instead of a veth pair"
    def __init__(self, delay_ms:float, tag:str=None):
        super().__init__(tag)
        self.delay_ms,self.proc = delay_ms,None
    def join(self):
        "Two TAP devices and the wire between them; a TAP keeps its file descriptor in the wire's process when it moves to a host"
        self.proc = subprocess.Popen([sys.executable, __file__, self.hosts[0][1], self.hosts[1][1], str(self.delay_ms)],
                                     stdout=subprocess.PIPE, text=True)
        if self.proc.stdout.readline().strip()!='ready': raise RuntimeError(f"delay_wire: the wire did not start ({self.proc.poll()})")
    def __exit__(self, *exc):
        if self.proc: self.proc.kill(); self.proc.wait()
        super().__exit__(*exc)

if __name__=='__main__':
    import ctypes, signal
    ctypes.CDLL(None).prctl(1, signal.SIGKILL) # PR_SET_PDEATHSIG: the wire ends with the process that started it, even killed
    a,b,ms = sys.argv[1], sys.argv[2], float(sys.argv[3])
    fa,fb = tap(a),tap(b)
    print('ready', flush=True)
    wire(fa, fb, ms/1e3)
