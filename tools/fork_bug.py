"""CPython's fork bug (gh-112275) without torch: fork while another thread creates and deletes Python thread states without the GIL,
as gloo's and NCCL's threads do after every collective. `python tools/fork_bug.py 1000` on each Python: children that hang."""
import ctypes, os, sys, threading, time, signal, warnings
warnings.simplefilter('ignore', DeprecationWarning) # 3.12 warns that fork in a threaded process may deadlock: the point here
api = ctypes.CDLL(None) # ctypes.CDLL releases the GIL around each call
interp = ctypes.pythonapi.PyInterpreterState_Main; interp.restype = ctypes.c_void_p
api.PyThreadState_New.restype = ctypes.c_void_p; api.PyThreadState_New.argtypes = [ctypes.c_void_p]
api.PyThreadState_Delete.argtypes = [ctypes.c_void_p]
main = interp()
def churn():
    while True: api.PyThreadState_Delete(api.PyThreadState_New(main))
threading.Thread(target=churn, daemon=True).start()
n,hung = int(sys.argv[1]),0
for i in range(n):
    pid = os.fork()
    if pid==0: os._exit(0)
    end = time.time()+2 # a child that only exits takes a millisecond
    while os.waitpid(pid, os.WNOHANG)==(0,0):
        if time.time()>end: hung += 1; os.kill(pid, signal.SIGKILL); os.waitpid(pid, 0); break
        time.sleep(0.001)
print(f"Python {sys.version.split()[0]}: {hung} of {n} forked children hung")
