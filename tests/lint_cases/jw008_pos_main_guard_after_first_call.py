# expect: JW008@8
import jax

SCALE = 1.0

@jax.jit
def scaled(x):
    return x * SCALE

def main():
    print(scaled(2.0))

if __name__ == "__main__":
    main()
    SCALE = 3.0  # too late: scaled was traced with 1.0
    main()
