"`python -m fastai.launch`: fastai dropped this module after 2.7.10; fastddp ships it and hands the work to `fastddp-launch`"
from fastddp.launch import main

if __name__=='__main__': main()
