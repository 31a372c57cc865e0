# expect: JW008@12
import jax

temperature = 1.0

def anneal():
    global temperature
    temperature = temperature * 0.5

@jax.jit
def sample_logits(logits):
    return logits / temperature
